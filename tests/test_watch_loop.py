"""The watch loop (grading/watching.py) on its own: commands, file changes and runs, with a
view that records what it is told and a run that is a stand-in. What the student sees of it
in a real terminal is tests/test_watch.py and tests/test_watch_screen.py."""

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from theinference import exits
from theinference.curriculum.stages import load_stages
from theinference.grading import ahead, watching
from theinference.results import RunResult, StageResult, Status

STAGES = load_stages()
WAIT = 10.0


@dataclass
class Course:
    root: Path


@dataclass
class StandInSession:
    course: Course
    stages: list
    all_stages: list
    renderer: object = None
    answers: object = None  # none kept across runs: no swap plans made ahead
    seed: int | None = None
    fresh_seed: bool = False
    policy: object = None


class RecordingView:
    """Every call the loop makes, in order, on one queue. `slow_end` holds the grading thread
    once a run is drawn, as a busy machine may: keys typed then must still read that run."""

    def __init__(self, slow_end: float = 0.0):
        self.told: queue.Queue = queue.Queue()
        self.slow_end = slow_end

    def drawing(self, trigger, cancel):
        self.told.put(("drawing", trigger))
        return lambda event: None

    def ended(self, result):
        self.told.put(("ended", None if result is None else [s.slug for s in result.stages]))
        time.sleep(self.slow_end)
        if result is not None and "draw fails" in result.notes:
            raise RuntimeError("the screen could not be drawn")

    def stopped(self, reason):
        self.told.put(("stopped", reason))

    def failed(self, message):
        self.told.put(("failed", message))

    def nothing_after(self, slug):
        self.told.put(("nothing after", slug))

    def hint(self, stage, graded):
        self.told.put(("hint", stage.slug, None if graded is None else graded.status))

    def next(self, kind: str):
        """The next call of this kind (others before it are dropped)."""
        while True:
            told = self.told.get(timeout=WAIT)
            if told[0] == kind:
                return told[1:]


class Typed:
    """Commands as the key reader would give them."""

    def start(self, command):
        self.command = command

    def restore(self):
        self.restored = True


class StandInRun:
    """session.run: each stage passes unless named in `failing`; `raises` makes the next run
    fail inside the grader."""

    def __init__(self):
        self.failing: set[str] = set()
        self.raises = False
        self.notes: list[str] = []  # "draw fails": the view raises drawing this run

    def __call__(self, session, stages, cancel, trigger, listener):
        if self.raises:
            self.raises = False
            raise RuntimeError("an oracle file vanished")
        graded = [StageResult(s.slug, s.title, Status.FAILED if s.slug in self.failing
                              else Status.PASSED) for s in stages]
        return RunResult(graded, "synthetic", "0" * 64, notes=list(self.notes))


@pytest.fixture
def loop(tmp_path, monkeypatch, request):
    """A watch loop on the first stage of a course folder (or the first N, parametrized
    indirectly), running in a thread; yields (view, commands, stand-in run, the loop's exit
    code once it returns)."""
    focus = STAGES[: getattr(request, "param", 1)]
    stand_in = StandInRun()
    monkeypatch.setattr(watching, "run", stand_in)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "kvcache.py").write_text("x = 1\n")
    session = StandInSession(Course(tmp_path), focus, STAGES)
    view, typed, code = RecordingView(slow_end=0.1), Typed(), queue.Queue()
    watch = watching.WatchLoop(session, view, typed, poll=True)
    thread = threading.Thread(target=lambda: code.put(watch.run()), daemon=True)
    thread.start()
    assert view.next("ended") == ([s.slug for s in focus],)  # the first run
    yield view, typed, stand_in, code
    typed.command(watching.QUIT)
    thread.join(WAIT)


def test_next_stage_walks_the_course_and_says_when_there_is_none(loop):
    """Catches `next stage` skipping or repeating a stage, or running past the last one."""
    view, typed, _, _ = loop
    for stage in STAGES[1:]:
        typed.command(watching.NEXT_STAGE)
        assert view.next("drawing") == (f"next stage: {stage.slug}",)
        assert view.next("ended") == ([stage.slug],)
    typed.command(watching.NEXT_STAGE)
    assert view.next("nothing after") == (STAGES[-1].slug,)


def test_rerun_every_stage_and_a_file_change(loop, tmp_path):
    """Catches a rerun grading other stages than those in focus, `every stage` not grading
    the whole course, and a change not naming the file that triggered the run."""
    view, typed, _, _ = loop
    typed.command(watching.RERUN)
    assert view.next("drawing") == ("rerun",)
    assert view.next("ended") == ([STAGES[0].slug],)
    typed.command(watching.EVERY_STAGE)
    assert view.next("ended") == ([s.slug for s in STAGES],)
    (tmp_path / "src" / "kvcache.py").write_text("x = 2\n")
    assert view.next("drawing") == ("src/kvcache.py changed",)


def test_a_grader_failure_is_told_and_the_loop_carries_on(loop):
    """Catches a failure inside the grader, in a run or in drawing one, ending the watch, going
    unreported, or losing the run's verdict."""
    view, typed, stand_in, code = loop
    stand_in.raises = True
    typed.command(watching.RERUN)
    assert "an oracle file vanished" in view.next("failed")[0]
    assert view.next("ended") == (None,)
    typed.command(watching.RERUN)
    assert view.next("ended") == ([STAGES[0].slug],)
    stand_in.notes = ["draw fails"]
    typed.command(watching.RERUN)
    assert "the screen could not be drawn" in view.next("failed")[0]
    typed.command(watching.QUIT)
    assert code.get(timeout=WAIT) == exits.OK


def test_hint_is_for_the_first_stage_not_passed_and_quit_gives_the_last_verdict(loop):
    """Catches the hint naming a passed stage while one in focus failed, and quit returning
    another run's verdict than the last."""
    view, typed, stand_in, code = loop
    stand_in.failing = {STAGES[1].slug}
    typed.command(watching.EVERY_STAGE)
    view.next("ended")
    typed.command(watching.HINT)
    assert view.next("hint") == (STAGES[0].slug, Status.PASSED)  # the focus is stage 1 alone
    typed.command(watching.NEXT_STAGE)
    view.next("ended")
    typed.command(watching.HINT)
    assert view.next("hint") == (STAGES[1].slug, Status.FAILED)
    stand_in.failing = set()
    typed.command(watching.RERUN)
    view.next("ended")
    typed.command(watching.HINT)  # asked as soon as the run is drawn: it reads that run
    assert view.next("hint") == (STAGES[1].slug, Status.PASSED)
    typed.command(watching.QUIT)
    assert code.get(timeout=WAIT) == exits.OK


@pytest.mark.parametrize("loop", [3], indirect=True)
def test_hint_in_a_focus_of_several_stages_is_the_first_not_passed(loop):
    """Catches the hint naming the last stage in focus (or a passed one) when an earlier one
    failed."""
    view, typed, stand_in, _ = loop
    stand_in.failing = {STAGES[1].slug}
    typed.command(watching.RERUN)
    view.next("ended")
    typed.command(watching.HINT)
    assert view.next("hint") == (STAGES[1].slug, Status.FAILED)


def all_passed(stages) -> RunResult:
    return RunResult([StageResult(s.slug, s.title, Status.PASSED) for s in stages],
                     "synthetic", "0" * 64)


def loop_with_plans(tmp_path, monkeypatch, plans, stand_in) -> tuple:
    """A watch loop on the first stage whose runs are `stand_in` and whose plans made between
    runs are `plans` (answers kept across runs), running in a thread: (view, commands, thread)."""
    monkeypatch.setattr(watching, "plan_ahead", plans)
    monkeypatch.setattr(watching, "run", stand_in)
    session = StandInSession(Course(tmp_path), STAGES[:1], STAGES,
                             answers=SimpleNamespace(last_planner=None))
    view, typed = RecordingView(), Typed()
    watch = watching.WatchLoop(session, view, typed, poll=True)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    return view, typed, thread


def test_the_next_run_grades_with_the_seed_its_plans_were_made_for_once(tmp_path, monkeypatch):
    """Catches swap plans made ahead (between runs) for a seed the next run does not draw, so
    made for nothing, and a seed graded by two runs (each run's swaps must be its own); and a
    seed drawn for one run taken for one given (--seed), whose drawn prompts' K/V would be
    kept on disk at every save though no run draws them again (judging.kept_prompts)."""
    planned_for, graded_with, given = [], queue.Queue(), []

    def stand_in(session, stages, cancel, trigger, listener):
        graded_with.put(session.seed)
        given.append(session.seed is not None and not session.fresh_seed)
        return all_passed(stages)

    def plans(stages, answers, policy, seed, stop, seed_given=False):
        planned_for.append(seed)
        given.append(seed_given)

    view, typed, thread = loop_with_plans(tmp_path, monkeypatch, plans, stand_in)
    seeds = [graded_with.get(timeout=WAIT)]
    for _ in range(2):
        view.next("ended")
        time.sleep(0.2)  # the plans are made once the run is drawn
        typed.command(watching.RERUN)
        seeds.append(graded_with.get(timeout=WAIT))
    typed.command(watching.QUIT)
    thread.join(WAIT)
    assert seeds[0] is None, "the first run has no plans made ahead: it draws its own seed"
    assert seeds[1:] == planned_for[:2] and planned_for[0] != planned_for[1]
    assert not any(given), given


def test_a_save_while_the_next_runs_plans_are_made_starts_its_run_at_once(tmp_path, monkeypatch):
    """Catches the loop waiting, on a save, for the plan being made between runs (seconds of
    oracle work on a long prompt) before it starts the run: the first verdict waited for it.
    The run's planner waits for it instead (ahead.Between), before any measured call."""
    planning, release = threading.Event(), threading.Event()

    def slow_plans(stages, answers, policy, seed, stop, seed_given=False):
        planning.set()
        release.wait(WAIT)  # one plan, longer than the save's wait

    graded_with, waited = queue.Queue(), []

    def stand_in(session, stages, cancel, trigger, listener):
        graded_with.put(session.seed)
        if session.answers.last_planner is not None:  # as the run's Planner sees it
            waited.append(session.answers.last_planner)
        return all_passed(stages)

    view, typed, thread = loop_with_plans(tmp_path, monkeypatch, slow_plans, stand_in)
    graded_with.get(timeout=WAIT)
    assert planning.wait(WAIT)
    typed.command(watching.RERUN)
    try:
        graded_with.get(timeout=WAIT / 2)  # raises Empty if the rerun waits for the plan
        between = waited[-1]
        assert isinstance(between, ahead.Between) and between.thread.is_alive()
    finally:
        release.set()
    between.done()  # what the run's Planner does before a measured call: the plan is over
    assert not between.thread.is_alive()
    typed.command(watching.QUIT)
    thread.join(WAIT)


def test_where_blas_has_threads_a_save_waits_for_the_plan_being_made(tmp_path, monkeypatch):
    """Catches a run started beside the plan being made where the grader's OpenBLAS has
    threads of its own: a student process forked while that plan is inside OpenBLAS hangs the
    grader for good (environment.blas_is_one_thread), so there the save waits for the plan."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    planning, release, order = threading.Event(), threading.Event(), []

    def slow_plans(stages, answers, policy, seed, stop, seed_given=False):
        planning.set()
        release.wait(WAIT)
        order.append("plan over")

    def stand_in(session, stages, cancel, trigger, listener):
        order.append("run")
        return all_passed(stages)

    view, typed, thread = loop_with_plans(tmp_path, monkeypatch, slow_plans, stand_in)
    assert planning.wait(WAIT)
    typed.command(watching.RERUN)
    time.sleep(0.5)  # a rerun started beside the plan would have run by now
    assert order == ["run"], order
    release.set()
    deadline = time.monotonic() + WAIT
    while len(order) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert order[:3] == ["run", "plan over", "run"], order
    typed.command(watching.QUIT)
    thread.join(WAIT)
