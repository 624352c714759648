"""A stage's cases beside each other (`--jobs`): the run's student processes each take the next
case as they come free, so a stage's wall time is its longest case's, not their sum. In a run
that grades every case, every unmeasured case once the stage has begun (the first process
taking the small ones smallest first, so that their verdicts come first); in watch mode, which
stops at a failure, the long ones only, after the small ones one by one.

Each case is still graded alone, in one process, its CPU read from outside as ever. Measured
calls (a cost proof against the floor) never run beside another: each runs in a fresh process
of its own, one after another, so that its rate and its CPU are its own. A measured case whose
cache is swapped is tried first beside the others, as an unmeasured one (swap_first.py): the
swap's evidence holds wherever the call runs; it is measured alone only where the floor must
judge it, once the cases beside it are done.
"""

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from theinference.curriculum.stages import Case
from theinference.grading.ahead import runs_alone
from theinference.grading.environment import blas_is_one_thread
from theinference.grading.policy import LONG_CASE_TOKENS, case_size
from theinference.student.process import StudentProcess
from theinference.student.setup import Limits, ProcessSetup


class AheadProcess(StudentProcess):
    """A student process that Workers' starter thread starts ahead of its call."""

    def start(self) -> None:
        if self._proc is None or self._proc.popen.poll() is not None:  # as a call would
            self._start()


class Workers:
    """The run's student processes: the first serves every case in turn; the others, started
    when a stage has long cases for them, take those beside it. Use as a context.

    Each is started ahead of its call (the first while the oracle makes the stage's first
    plan, the others while the first takes the small cases) by one thread that lives as long
    as the run: a process dies with the thread that started it (bubblewrap's --die-with-parent,
    the worker's own parent-death signal), so started by a thread that ends, it would be gone
    by its first case."""

    def __init__(self, setup: ProcessSetup, jobs: int):
        self.setup, self.jobs = setup, max(jobs, 1)
        self.processes: list[StudentProcess] = [AheadProcess(setup)]
        self.starter = ThreadPoolExecutor(1, thread_name_prefix="theinference-starter")
        self.starting: list[Future] = []  # starts asked of the starter, not yet waited for
        self.starts: dict[int, Future] = {}  # each process's last start asked, by its id

    @property
    def first(self) -> StudentProcess:
        return self.processes[0]

    def at_most(self, count: int, limits: Limits) -> list[StudentProcess]:
        """`count` processes (no more than --jobs), the first among them; the others with
        `limits`, being started: each waits for its own start before its first case
        (`wait_for`), so the first takes its cases while the others start."""
        self.start_ahead(count, limits)
        return self.processes[: min(count, self.jobs)]

    def wait_for(self, process: StudentProcess) -> None:
        """Wait until `process`, if it was asked to start, has (a fault is raised here)."""
        start = self.starts.get(id(process))
        if start is not None:
            start.result()

    def start_first(self, limits: Limits) -> None:
        """Have the first process started with `limits`, without waiting (`started` waits)."""
        self._have_started(self.processes[:1], limits)

    def start_ahead(self, count: int, limits: Limits) -> None:
        """Have the processes beside the first that `count` long cases will take started with
        `limits`, without waiting (at_most and `started` wait)."""
        while len(self.processes) < min(count, self.jobs):
            self.processes.append(AheadProcess(self.setup))
        wanted = self.processes[1 : min(count, self.jobs)]
        self._have_started([p for p in wanted if not self.starting_with(p, limits)], limits)

    def starting_with(self, process: StudentProcess, limits: Limits) -> bool:
        """Whether `process` is being started with `limits` already: asked again, the first
        process would wait for that start before its next small case."""
        start = self.starts.get(id(process))
        return start is not None and not start.done() and process.limits == limits

    def _have_started(self, processes: list, limits: Limits) -> None:
        for process in processes:
            self.wait_for(process)  # a process is never given limits while it starts
            process.use_limits(limits)
            self.starting.append(self.starter.submit(process.start))
            self.starts[id(process)] = self.starting[-1]

    def started(self) -> None:
        """Wait until no process is starting (before a call whose CPU is measured)."""
        while True:
            try:
                starting = self.starting.pop()  # one at a time, whichever thread asks
            except IndexError:
                return
            starting.result()  # a fault of the grader's own is raised here

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.started()
        finally:
            close_all(self.processes)
            self.starter.shutdown()


def close_all(processes: list[StudentProcess]) -> None:
    """Close every process at once: each close looks at its tree until it is quiet, a few
    hundredths of a second that one after another added to every run's end. A close that
    fails is raised here once every one has ended."""
    failed: list[BaseException] = []

    def close(process: StudentProcess) -> None:
        try:
            process.close()
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the run's thread)
            failed.append(exc)

    closing = [threading.Thread(target=close, args=(p,), name="theinference-close")
               for p in processes[1:]]
    for thread in closing:
        thread.start()
    for process in processes[:1]:
        close(process)
    for thread in closing:
        thread.join()
    if failed:
        raise failed[0]


def long_run(cases: list[Case], start: int, config) -> int:
    """How many cases from `start` on go beside each other: the long ones that are not
    measured, in a row (the policy orders cases smallest first)."""
    end = start
    while end < len(cases) and goes_beside(cases[end], config):
        end += 1
    return end - start


def beside_count(cases: list[Case], start: int, config, jobs: int, stops_early: bool) -> int:
    """How many cases from `start` on are graded beside each other (grade_beside): the long
    unmeasured ones in a row; in a run that grades every case (not `stops_early`), once the
    stage has begun, every unmeasured one in a row, the first process taking the small ones
    smallest first (their verdicts come first) while the others take the largest."""
    if jobs <= 1:
        return 0
    if start == 0 or stops_early:
        return long_run(cases, start, config)
    return unmeasured_run(cases, start, config)


def unmeasured_run(cases: list[Case], start: int, config) -> int:
    """How many cases from `start` on are unmeasured, in a row (none where the grader's BLAS
    runs more than one thread: see goes_beside)."""
    end = start
    while end < len(cases) and blas_is_one_thread() and not runs_alone(cases[end], config):
        end += 1
    return end - start


def goes_beside(case: Case, config) -> bool:
    """A long unmeasured case, where the grader's BLAS runs one thread (ahead.py: a process
    started from one thread while another is inside a multithreaded OpenBLAS hangs)."""
    if case_size(case) <= LONG_CASE_TOKENS or case.inputs.get("must_raise"):
        return False
    if not blas_is_one_thread():
        return False
    return not runs_alone(case, config)


def grade_beside(cases: list[Case], processes: list[StudentProcess],
                 grade_one: Callable[[Case, StudentProcess], object], cancel,
                 ready: Callable[[StudentProcess], None] = lambda process: None) -> list:
    """grade_one(case, process) for every case, each process taking the next case as it comes
    free: the first process the smallest left while it is a short case (its verdict comes
    first), else, as the others, the largest (all smallest first, the longest would start
    last and end alone: 573, 785 and 1024 tokens on two processes took 573 + 1024, not 1024),
    each once `ready` (its start waited for); the outputs in the cases' order (None for a case
    a cancel left unrun)."""
    outputs: list = [None] * len(cases)
    pending = deque(sorted(range(len(cases)), key=lambda i: case_size(cases[i])))
    lock = threading.Lock()
    failed: list[BaseException] = []  # a grader fault in a thread is raised here, not lost

    def serve(process: StudentProcess) -> None:
        first = process is processes[0]
        try:
            ready(process)
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the run's thread)
            failed.append(exc)
        while not cancel.is_set() and not failed:
            with lock:
                short = pending and case_size(cases[pending[0]]) <= LONG_CASE_TOKENS
                index = (pending.popleft() if first and short else pending.pop()) if pending \
                    else None
            if index is None:
                return
            try:
                outputs[index] = grade_one(cases[index], process)
            except BaseException as exc:  # noqa: BLE001 (re-raised below, in the run's thread)
                failed.append(exc)

    threads = [threading.Thread(target=serve, args=(p,), daemon=True) for p in processes[1:]]
    for thread in threads:
        thread.start()
    serve(processes[0])
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return outputs
