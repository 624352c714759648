"""A CPU account no process leaves: a cgroup of its own per student worker (Linux).

The kernel charges a cgroup with the CPU of every task in it, threads and children alike, and a
child starts in its parent's cgroup: a process the student's code starts, whether it is waited
for, auto-reaped (SIGCHLD ignored), double-forked or exec'd, is counted there, which the /proc
tree measure (cpu.py) cannot promise once the kernel has reaped a child nobody waited for.

cgroup v2: a child of the grader's own cgroup, whose `cpu.stat` has `usage_usec` with no
controller enabled; else cgroup v1's `cpuacct` hierarchy (`cpuacct.usage`, nanoseconds). Found
at run time from /proc/self/cgroup and /proc/self/mountinfo, and used only where the grader can
make one and move a process into it: containers and gVisor often allow neither.
"""

import functools
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from theinference.student.cpu import CpuTime

PREFIX = "theinference-"
EMPTY_WAIT = 2.0  # seconds for killed processes to leave the cgroup before it is removed
FREEZE_WAIT = 1.0  # seconds for every task of a cgroup to stop (one in a syscall may take a moment)


@dataclass(frozen=True)
class Home:
    """Where the grader makes its workers' cgroups: its own cgroup, in one hierarchy."""

    version: int  # 2, or 1 (cpuacct)
    path: Path  # the grader's own cgroup's folder
    hierarchy: str  # its key in /proc/<pid>/cgroup: "" for v2, the controllers for v1
    named: str  # its path as /proc/<pid>/cgroup names it

    @property
    def label(self) -> str:
        return f"cgroup v{self.version}"


def own_cgroups(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup as {controllers: path}; the v2 line's controllers are ""."""
    found = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            found[parts[1]] = parts[2]
    return found


def mounts(text: str) -> list[tuple[str, str, str, set[str]]]:
    """The cgroup mounts of /proc/self/mountinfo: (fstype, root, mount point, super options)."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        after = fields[fields.index("-") + 1 :]
        if after[0] in ("cgroup", "cgroup2"):
            found.append((after[0], fields[3], unescape(fields[4]), set(after[2].split(","))))
    return found


def unescape(path: str) -> str:
    """mountinfo's octal escapes (a space is \\040) undone."""
    return path.encode().decode("unicode_escape") if "\\" in path else path


def candidates(cgroup_text: str, mountinfo_text: str) -> list[Home]:
    """The grader's own cgroup in each hierarchy that can account CPU: v2 first, then v1's
    cpuacct."""
    own = own_cgroups(cgroup_text)
    homes = []
    for fstype, root, point, options in mounts(mountinfo_text):
        if fstype == "cgroup2" and "" in own:
            key, version = "", 2
        elif fstype == "cgroup" and "cpuacct" in options:
            key = next((k for k in own if "cpuacct" in k.split(",")), None)
            version = 1
            if key is None:
                continue
        else:
            continue
        relative = os.path.relpath(own[key], root) if own[key].startswith(root) else None
        if relative is None or relative.startswith(".."):
            continue  # the grader's cgroup is not under this mount (another namespace's view)
        homes.append(Home(version, Path(point) / relative, key, own[key]))
    return sorted(homes, key=lambda h: -h.version)


@functools.cache
def home() -> tuple[Home | None, str]:
    """(Where this grader can make cgroups that account CPU, "") or (None, why not): probed
    once, by making one and reading its account."""
    try:
        cgroup_text = Path("/proc/self/cgroup").read_text()
        mountinfo_text = Path("/proc/self/mountinfo").read_text()
    except OSError as exc:
        return None, f"/proc cannot be read ({exc.strerror or exc})"
    found = candidates(cgroup_text, mountinfo_text)
    if not found:
        return None, "no cgroup hierarchy that accounts CPU is mounted here"
    whys = []
    for place in found:
        why = probe(place)
        if not why:
            return place, ""
        whys.append(f"{place.label}: {why}")
    return None, "; ".join(whys)


def probe(place: Home) -> str:
    """Why no worker cgroup can be made under `place` ("" when one can): one is made, its
    account read, and removed; stale ones a killed grader left are removed on the way."""
    remove_stale(place)
    try:
        made = Cgroup.make(place)
    except OSError as exc:
        return f"cannot make a cgroup in {place.path} ({exc.strerror or exc})"
    try:
        made.cpu_time()
    except (OSError, ValueError) as exc:
        return f"its CPU account cannot be read ({exc})"
    finally:
        made.remove()
    return ""


def remove_stale(place: Home) -> None:
    """Remove the empty worker cgroups of graders that are gone (named by their pid)."""
    try:
        entries = list(place.path.glob(PREFIX + "*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                entry.rmdir()
            except OSError:
                pass  # still holds a process, or not ours: left as it is


@dataclass
class Cgroup:
    """One worker's cgroup."""

    place: Home
    path: Path

    @classmethod
    def make(cls, place: Home) -> "Cgroup":
        path = place.path / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir(mode=0o755)
        return cls(place, path)

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def cpu_time(self) -> CpuTime:
        """CPU time charged to this cgroup and its descendants since it was made, in user
        mode and in the kernel; all of it as user time where the account does not split it
        (the stricter reading: kernel time is forgiven only up to a share, cpu.py)."""
        if self.place.version == 2:
            stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines()
                        if line.count(" ") == 1)
            if "user_usec" in stat and "system_usec" in stat:
                return CpuTime(int(stat["user_usec"]) / 1e6, int(stat["system_usec"]) / 1e6)
            if "usage_usec" not in stat:
                raise ValueError("cpu.stat has no usage_usec")
            return CpuTime(int(stat["usage_usec"]) / 1e6)
        try:  # cgroup v1's split, nanoseconds (Linux 4.7 on)
            user, kernel = ((self.path / f"cpuacct.usage_{k}").read_text() for k in ("user", "sys"))
            return CpuTime(int(user) / 1e9, int(kernel) / 1e9)
        except FileNotFoundError:
            return CpuTime(int((self.path / "cpuacct.usage").read_text()) / 1e9)

    def add(self, pid: int) -> None:
        """Move a process (all its threads) into this cgroup; OSError when that is refused."""
        with open(self.procs, "w") as procs:
            procs.write(str(pid))

    def holds(self, pid: int) -> bool:
        """Whether pid is in this cgroup or below it (from /proc/<pid>/cgroup)."""
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        path = own_cgroups(text).get(self.place.hierarchy)
        mine = self.place.named.rstrip("/") + "/" + self.path.name
        return path is not None and (path == mine or path.startswith(mine + "/"))

    def pids(self) -> set[int]:
        try:
            return self.members()
        except (OSError, ValueError):
            return set()

    def members(self) -> set[int]:
        """The processes in it, read in one pass; OSError where it cannot be read."""
        return {int(p) for p in self.procs.read_text().split()}

    def kill_all(self) -> None:
        """SIGKILL every process in it (cgroup.kill where the kernel has it), until none is."""
        deadline = time.monotonic() + EMPTY_WAIT
        while (pids := self.pids()) and time.monotonic() < deadline:
            try:
                (self.path / "cgroup.kill").write_text("1")
            except OSError:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.01)

    def freeze(self) -> bool:
        """Stop every task in it (cgroup v2's freezer: a frozen task cannot fork, and a fork
        in flight lands frozen); False where this kernel or cgroup has no freezer, or the
        tasks did not all stop in time (then it is thawed again)."""
        if self.place.version != 2:
            return False
        try:
            (self.path / "cgroup.freeze").write_text("1")
        except OSError:
            return False
        deadline = time.monotonic() + FREEZE_WAIT
        while time.monotonic() < deadline:
            try:
                if "frozen 1" in (self.path / "cgroup.events").read_text().splitlines():
                    return True
            except OSError:
                break
            time.sleep(0.001)
        self.thaw()
        return False

    def thaw(self) -> None:
        try:
            (self.path / "cgroup.freeze").write_text("0")
        except OSError:
            pass

    def kill_but(self, keep: frozenset[int]) -> None:
        """SIGKILL every process in it but `keep` (frozen, they die when thawed)."""
        for pid in self.pids() - keep:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def remove(self) -> None:
        """Remove it, once its processes are gone (a killed one may take a moment to leave)."""
        deadline = time.monotonic() + EMPTY_WAIT
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # left for remove_stale: a later grader removes it
                time.sleep(0.01)
