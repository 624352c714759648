"""What containment costs the grader: one look at the student's process tree (the watchdog's,
every 0.1 s during a call), the end-of-call sweep, and a trivial adapter call end to end, per
sandbox mode this machine has; and what the attacks it stops come to (a detached helper's
CPU time as measured, how long a 500 MiB shared mapping lasts under a 0.2 GiB cap).

    python benchmarks/containment_cost.py [--repeats 20]
"""

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from theinference.student import reaper, sandbox  # noqa: E402
from theinference.student.cpu import process_table, tree_look  # noqa: E402
from theinference.student.process import StudentProcess  # noqa: E402
from theinference.student.sandbox import Sandbox  # noqa: E402
from theinference.student.setup import Limits, ProcessSetup  # noqa: E402

ADAPTERS = textwrap.dedent(
    """
    import mmap, os, time

    def nothing(ids):
        return [1.0]

    def helper(seconds):
        read, write = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                end = time.process_time() + seconds
                while time.process_time() < end:
                    pass
                os.write(write, b"done")
                os._exit(0)
            os._exit(0)
        os.close(write)
        while os.read(read, 64):
            pass
        return [1.0]

    def shared(ids):
        area = mmap.mmap(-1, 500 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        for offset in range(0, 500 << 20, 1 << 20):
            area[offset:offset + (1 << 20)] = b"x" * (1 << 20)
        time.sleep(5)
        return [1.0]
    """
)


def modes() -> list[str]:
    kinds = ["none"]
    if sandbox.choose("none").kind == "unprivileged-user":
        kinds.append("unprivileged-user")
    if not sandbox.bwrap_problem():
        kinds.append("bwrap")
    return kinds


def course(root: Path) -> Path:
    for folder in ("tests", "src"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "tests" / "adapters.py").write_text(ADAPTERS)
    return root


def milliseconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def one_mode(kind: str, root: Path, repeats: int) -> None:
    limits = Limits(timeout=60, memory_bytes=int(0.2 * 2**30))
    with StudentProcess(ProcessSetup(
            root, Path("/nonexistent"), limits, sandbox=Sandbox(kind))) as student:
        student.call("nothing", [[1]])  # started
        proc = student._proc
        look = milliseconds(lambda: tree_look(proc.root, proc.since), repeats)
        sweep = milliseconds(lambda: reaper.kill_tree(proc.root, proc.since, proc.keep), repeats)
        call = milliseconds(lambda: student.call("nothing", [[1]]), repeats)
        helper = student.call("helper", [1.0])
        shared = student.call("shared", [[1]])
    print(
        f"{kind}: a look {look:.2f} ms, the sweep {sweep:.2f} ms, a trivial call {call:.1f} ms "
        f"(medians of {repeats}); a detached helper's 1.0 s of CPU measured as "
        f"{helper.cpu_seconds:.2f} s; 500 MiB shared under a 0.2 GiB cap: {shared.kind} after "
        f"{shared.seconds:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"{len(process_table())} processes on this machine")
    with tempfile.TemporaryDirectory() as tmp:
        root = course(Path(tmp) / "course")
        for kind in modes():
            one_mode(kind, root, args.repeats)


if __name__ == "__main__":
    main()
