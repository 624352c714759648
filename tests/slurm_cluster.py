"""A one-node Slurm cluster for a test: munged, slurmctld and slurmd (Debian's slurm-wlm and
munge) started as root in the foreground, their key, state, spool and logs in a folder of the
test's, on ports of their own, and stopped after with every job they ran. The plugins are ones
that need no cgroup and no accounting database, so the cluster runs in a container or gVisor:
no job is confined to its cores or memory (the grader sizes itself to what the job asked)."""

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
CONFIG = """ClusterName=theinference
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=32768 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def unavailable() -> str | None:
    """Why no cluster can be started here, or None."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): "
                "apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user only when it runs as root; this test is not root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]  # SLURM_CONF set: sbatch, squeue and scancel talk to this cluster
    daemons: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=60,
                              **kwargs)

    def queued(self) -> list[str]:
        """Every job id squeue shows: pending, running or completing."""
        out = self.run("squeue", "-h", "-o", "%i").stdout
        return out.split()

    def state(self, job: str) -> dict[str, str]:
        """scontrol's fields of one job (of an array: its first task's), e.g. JobState."""
        out = self.run("scontrol", "-o", "show", "job", job).stdout.splitlines()
        return dict(w.split("=", 1) for w in out[0].split() if "=" in w) if out else {}

    def wait_idle(self, timeout: float) -> None:
        """Until no job is queued or running; a timeout is the test's failure."""
        deadline = time.monotonic() + timeout
        while self.queued():
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs still queued after {timeout:g} s:\n"
                                     + self.run("squeue").stdout)
            time.sleep(1)

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text()[-1500:]
                         for p in sorted((self.root / "log").glob("*.log")))

    def stop(self) -> None:
        """Every job cancelled, then the daemons ended (SIGTERM, then SIGKILL)."""
        if self.daemons and self.queued():
            self.run("scancel", *self.queued())
            try:
                self.wait_idle(30)
            except AssertionError:
                pass
        for daemon in reversed(self.daemons):
            daemon.terminate()
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(10)
        self.daemons.clear()


def start(root: Path) -> Cluster:
    """munged, slurmctld and slurmd up, the node idle; a cluster that does not come up within
    30 s raises RuntimeError with the daemons' logs."""
    for folder in ("munge", "state", "spool", "log"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    (root / "munge" / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge" / "munge.key").chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(CONFIG.format(host=host, root=root, ctld_port=free_port(),
                                  slurmd_port=free_port()))
    cluster = Cluster(root, {**os.environ, "SLURM_CONF": str(conf)})
    munge = root / "munge"
    commands = [
        ["munged", "-F", "--force", f"--socket={munge}/socket", f"--key-file={munge}/munge.key",
         f"--log-file={root}/log/munged.log", f"--pid-file={munge}/munged.pid",
         f"--seed-file={munge}/seed"],
        ["slurmctld", "-D", "-c", "-f", str(conf)],
        ["slurmd", "-D", "-N", host, "-f", str(conf)],
    ]
    try:
        for command in commands:
            with open(root / "log" / f"{command[0]}.err", "w") as err:  # the child keeps it
                cluster.daemons.append(subprocess.Popen(
                    command, env=cluster.env, stdout=subprocess.DEVNULL, stderr=err))
            wait_up(cluster, command[0])
    except RuntimeError:
        cluster.stop()
        raise
    return cluster


def wait_up(cluster: Cluster, daemon: str, timeout: float = 30) -> None:
    """Until the daemon answers: munge's socket exists, slurmctld answers, the node is idle."""
    probe = {
        "munged": lambda: (cluster.root / "munge" / "socket").exists(),
        "slurmctld": lambda: cluster.run("scontrol", "ping").stdout.count("UP") > 0,
        "slurmd": lambda: "idle" in cluster.run("sinfo", "-h", "-o", "%t").stdout,
    }[daemon]
    deadline = time.monotonic() + timeout
    while not probe():
        if cluster.daemons[-1].poll() is not None or time.monotonic() > deadline:
            err = (cluster.root / "log" / f"{daemon}.err").read_text()[-1500:]
            raise RuntimeError(f"{daemon} did not come up: {err}\n{cluster.log_tail()}")
        time.sleep(0.3)
