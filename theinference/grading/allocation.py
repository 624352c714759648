"""What this process may use: its CPUs and its memory, sized to its allocation, not the node.

A Slurm task, a Kubernetes pod or a Gradescope container runs on a machine larger than what it
was given. The CPUs are the least of the machine's count, the CPU affinity (a cpuset, `taskset`,
Slurm's binding), the cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
`cpu.cfs_period_us`, rounded up, at least 1) and a figure the scheduler passed in (`grade
--cpus`); the memory the least of MemAvailable, the cgroup's memory limit (v2 `memory.max`, v1
`memory.limit_in_bytes`, its "unlimited" ignored) and the scheduler's figure (`grade --memory`).
The process's cgroups come from /proc/self/cgroup, their mounts from /proc/self/mountinfo, and
a limit set on an enclosing cgroup (a Slurm job around its step, a pod around its container)
counts too. Every read tolerates absence (gVisor, macOS, no cgroup mounted): what cannot be
read is the machine's figure. Each figure says where it came from, for the records and reports.
"""

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

MACHINE = "machine"
AFFINITY = "affinity"
QUOTA = "cgroup quota"
LIMIT = "memory limit"
DECLARED = "declared"  # passed in: the scheduler's figure (grade --cpus / --memory)
UNLIMITED = 1 << 60  # v1's "no limit" is about 2**63 (rounded to pages); no machine has this
SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)b?", re.IGNORECASE)


@dataclass(frozen=True)
class Allocation:
    cpus: int
    memory_bytes: int
    cpus_from: str  # machine | affinity | cgroup quota | declared
    memory_from: str  # machine | memory limit | declared

    def text(self) -> str:
        """`1 CPU (affinity), 9.5 GiB (memory limit)`"""
        return (f"{self.cpus} CPU{'s' if self.cpus != 1 else ''} ({self.cpus_from}), "
                f"{gib(self.memory_bytes)} ({self.memory_from})")


GRADER_OVERHEAD_BYTES = 3 << 29  # the grader process beside each student process (1.5 GiB)


def default_jobs(memory_bytes: int, allocation: Allocation | None = None) -> int:
    """Student processes at once (a class's submissions, a stage's long cases): as many as the
    allocation has CPUs, and as fit in its memory with every student process at its cap beside
    its grader: never more."""
    allocation = allocation or read_allocation()
    fit = allocation.memory_bytes // (memory_bytes + GRADER_OVERHEAD_BYTES)
    return max(1, min(allocation.cpus, fit))


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def read_allocation(
    declared_cpus: int | None = None,
    declared_memory: int | None = None,
    *,
    root: Path = Path("/"),
    affinity: int | None = None,
    machine_cpus: int | None = None,
) -> Allocation:
    """This process's allocation. `root` holds proc/ and the cgroup mounts (a fake tree in
    tests); `affinity` and `machine_cpus` replace the live process's figures when given."""
    cgroups = own_cgroups(root)
    cpus = [(machine_cpus or os.cpu_count() or 1, MACHINE)]
    cpus.append((affinity if affinity is not None else live_affinity(), AFFINITY))
    cpus += [(n, QUOTA) for n in cpu_quotas(cgroups)]
    cpus.append((declared_cpus, DECLARED))
    memory = [(available_memory(root) or None, MACHINE)]
    memory += [(n, LIMIT) for n in memory_limits(cgroups)]
    memory.append((declared_memory, DECLARED))
    cpu_count, cpus_from = least(cpus)
    memory_bytes, memory_from = least(memory)
    return Allocation(max(1, cpu_count), max(0, memory_bytes), cpus_from, memory_from)


def least(figures: list[tuple[int | None, str]]) -> tuple[int, str]:
    """The smallest figure and its source; on a tie the earlier (the more general) source, so
    an affinity that is the whole machine is `machine`."""
    best: tuple[int | None, str] = (None, "unknown")
    for figure in figures:
        if figure[0] is not None and (best[0] is None or figure[0] < best[0]):
            best = figure
    return (best[0] or 0), best[1]


def live_affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        return None


def available_memory(root: Path = Path("/")) -> int:
    """MemAvailable (free now, counting what the kernel can reclaim); else all of memory; 0
    when neither can be read."""
    for line in read_text(root / "proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                break
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


# --- cgroups ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cgroups:
    """The folders of this process's cgroups and of every cgroup enclosing them, innermost
    first: `v2` for the unified hierarchy, and one list per v1 controller that has a mount."""

    v2: tuple[Path, ...] = ()
    cpu: tuple[Path, ...] = ()  # v1
    memory: tuple[Path, ...] = ()  # v1


def own_cgroups(root: Path = Path("/")) -> Cgroups:
    memberships = {}  # "" for v2, else each v1 controller -> the cgroup's path
    for line in read_text(root / "proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:
            memberships[""] = path
        for controller in filter(None, controllers.split(",")):
            memberships.setdefault(controller, path)
    mounts = cgroup_mounts(read_text(root / "proc/self/mountinfo"))

    def chain(key: str) -> tuple[Path, ...]:
        if key not in memberships or key not in mounts:
            return ()
        mount_root, mount_point = mounts[key]
        return enclosing(root / mount_point.lstrip("/"), within(memberships[key], mount_root))

    return Cgroups(v2=chain(""), cpu=chain("cpu"), memory=chain("memory"))


def cgroup_mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """The cgroup hierarchies' first mounts: "" for cgroup2, else each v1 controller ->
    (the path of the cgroup mounted, where it is mounted)."""
    mounts: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        mount_root, mount_point = unescape(fields[3]), unescape(fields[4])
        fstype, options = after[0], after[2].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("", (mount_root, mount_point))
        elif fstype == "cgroup":
            for option in options:
                mounts.setdefault(option, (mount_root, mount_point))
    return mounts


def unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as \\040 and the like."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def within(path: str, mount_root: str) -> str:
    """The cgroup's path below its mount: the mount may show a subtree only (a container's
    own cgroup, mounted as its /sys/fs/cgroup). A path outside the mount (`/..` under a cgroup
    namespace) is the mount itself: the closest this process can read."""
    path = path.strip()
    if mount_root in ("", "/"):
        relative = path
    elif path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
        relative = path[len(mount_root.rstrip("/")):]
    else:
        return ""
    parts = [p for p in relative.split("/") if p]
    return "" if ".." in parts else "/".join(parts)


def enclosing(mount: Path, relative: str) -> tuple[Path, ...]:
    """The cgroup's folder and each folder above it, up to the mount."""
    folders = [mount]
    for part in filter(None, relative.split("/")):
        folders.append(folders[-1] / part)
    return tuple(reversed(folders))


def cpu_quotas(cgroups: Cgroups) -> list[int]:
    """Every CPU quota on the way up, in CPUs (rounded up, at least 1)."""
    quotas = []
    for folder in cgroups.v2:  # cpu.max: "max 100000" or "150000 100000"
        fields = read_text(folder / "cpu.max").split()
        if len(fields) == 2 and fields[0] != "max":
            quotas.append(cpus_of(fields[0], fields[1]))
    for folder in cgroups.cpu:  # v1: a quota of -1 is none
        quotas.append(cpus_of(read_text(folder / "cpu.cfs_quota_us"),
                              read_text(folder / "cpu.cfs_period_us")))
    return [q for q in quotas if q is not None]


def cpus_of(quota: str, period: str) -> int | None:
    try:
        q, p = int(quota.strip()), int(period.strip())
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return max(1, math.ceil(q / p))


def memory_limits(cgroups: Cgroups) -> list[int]:
    """Every memory limit on the way up, in bytes (v1's "unlimited" left out)."""
    limits = []
    for folder, name in [(f, "memory.max") for f in cgroups.v2] + [
            (f, "memory.limit_in_bytes") for f in cgroups.memory]:
        text = read_text(folder / name).strip()
        if text.isdigit() and int(text) < UNLIMITED:  # "max" (v2) is no limit
            limits.append(int(text))
    return limits


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def parse_size(text: str) -> int:
    """`10G`, `10240M`, `10Gi`, `512MiB` or a number of bytes: K, M, G, T and P are powers of
    1024 (as Slurm's), with or without `i`. ValueError for anything else, or for nothing."""
    match = SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a size: {text!r} (e.g. 10G, 10240M, or bytes)")
    number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * 1024 ** ("kmgtp".index(unit) + 1 if unit else 0))
    if size <= 0:
        raise ValueError(f"not a size above zero: {text!r}")
    return size
