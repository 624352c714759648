"""Cache use proven in every cached stage: a submission that recomputes fails with a message
that says so, in any layout; a correct solution in any layout passes; "cannot tell" never
passes."""

import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import SOLUTIONS, grade_course, make_course, reference_text
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.checks.common import Verdict, Words
from theinference.curriculum.checks.cost import baseline_probe, call_against_baseline, cost_verdict
from theinference.curriculum.stages import load_stages
from theinference.results import Status
from theinference.student.process import Limits, StudentProcess
from theinference.student.worker import probes

CHEATS = tomllib.loads((SOLUTIONS / "recompute_cheats.toml").read_text())["cheats"]
CACHED = ["full-decode-step", "per-step-identity", "generate-loop", "prefix-caching"]
LAYOUTS = ["reference_kvcache.py", "independent_kvcache.py", "preallocated_kvcache.py"]
COST_CASE = {"full-decode-step": "reads the cache", "per-step-identity": "reads the cache"}
COST_CASE |= {"generate-loop": "comes from the cache", "prefix-caching": "reuse is real"}


def only_case(slug: str, needle: str):
    (stage,) = [s for s in load_stages() if s.slug == slug]
    return replace(stage, cases=tuple(c for c in stage.cases if needle in c.name))


def grade_one(course: Path, weights, slug: str, needle: str):
    from theinference.grading.grader import grade
    from theinference.results.events import ignore

    stage = replace(only_case(slug, needle), timeout=900)
    run = grade(course, [stage], weights, Limits(timeout=900), listener=ignore)
    ((case,),) = [s.cases for s in run.stages]
    return case


def test_every_cached_stage_has_a_cache_use_case_whose_check_probes():
    """Catches a cached stage that compares outputs only (a recompute would pass it)."""
    for slug in CACHED:
        (case,) = only_case(slug, COST_CASE[slug]).cases
        assert CHECKS[case.check].probe is not None, slug
    assert {c["stage"] for c in CHEATS} == set(CACHED)
    assert all(sum(c["stage"] == s for c in CHEATS) >= 2 for s in CACHED)  # two layouts each


# --- the behavioural verdict --------------------------------------------------------------


def say_for(slug: str) -> Words:
    return Words("theinference.curriculum.checks." + slug.replace("-", "_"))


def test_a_cost_far_past_the_margin_fails_and_says_what_was_measured():
    """Catches a recompute passing, or a failure that does not say what it measured."""
    probe = {"cpu_seconds": 25.3, "baseline_cpu_seconds": 1.2, "baseline_error": None}
    figures = {"steps": 24, "prompt": 1000, "total": 1024}
    verdict = cost_verdict(probe, say_for("per-step-identity"), figures)
    assert verdict.status == Status.FAILED
    assert "25.30 s of CPU" in verdict.message and "21.1x" in verdict.message
    assert "1024 tokens" in verdict.message and "recomputes" in verdict.message


def test_a_cost_within_the_margin_is_the_cost_of_a_cache():
    """Catches a correct solution failed for the cost its own prefill already has."""
    probe = {"cpu_seconds": 2.0, "baseline_cpu_seconds": 1.5, "baseline_error": None}
    measured = cost_verdict(probe, say_for("generate-loop"), {"steps": 8, "prompt": 5, "total": 13})
    assert isinstance(measured, str) and "1.33x" in measured


@pytest.mark.parametrize(
    "probe",
    [None, {}, {"cpu_seconds": 3.0, "baseline_error": "NotImplementedError: build-prefill"}],
)
def test_nothing_measured_is_never_a_pass(probe):
    """Catches "not applicable" counted as a pass."""
    verdict = cost_verdict(probe, say_for("prefix-caching"), {"prompts": 2, "total": 9})
    assert verdict.status == Status.FAILED and "does not pass" in verdict.message


# --- the structural probe, on layouts it was not written against ------------------------------


class PropertyCopies:
    def __init__(self):
        self._k = np.ones((2, 3, 4), dtype=np.float32)

    @property
    def k(self):
        return self._k.copy()


def test_zeroing_reaches_every_layout_and_never_the_weights():
    """Catches a probe defeated by a `.k` property that copies, per-head lists or one
    preallocated buffer, and a probe that corrupts the weights a cache refers to."""
    w = {"wte.weight": np.ones((5, 4), dtype=np.float32)}
    per_head = {"heads": [np.ones((3, 4), dtype=np.float32) for _ in range(2)], "w": w}
    buffer = np.ones((2, 2, 8), dtype=np.float32)
    view_holder = type("Layer", (), {})()
    view_holder.k = buffer[:, :3]  # a view: the whole buffer is zeroed
    layouts = [PropertyCopies(), per_head, view_holder]
    zeroed = probes.zero_arrays(layouts, skip=probes.array_ids(w))
    assert zeroed == 2 * 3 * 4 + 2 * 3 * 4 + buffer.size
    assert not layouts[0]._k.any() and not any(h.any() for h in per_head["heads"])
    assert not buffer.any() and w["wte.weight"].all()


def test_prefill_is_found_under_any_name_it_is_imported_as(tmp_path):
    """Catches a probe that only wraps `prefill` when the adapter uses that very name."""
    course = course_with(
        tmp_path,
        adapters="""
        import numpy as np
        from src.kvcache import prefill as build_cache
        class MC:
            def __init__(self): self.store = {"k": np.zeros((1, 4), dtype=np.float32)}
        def run(ids):
            mc = MC()
            build_cache(ids, {}, mc)
            return float(mc.store["k"].sum())
        """,
        kvcache="""
        import numpy as np
        def prefill(ids, w, mc):
            mc.store["k"] = np.ones((len(ids), 4), dtype=np.float32)
        """,
    )
    with StudentProcess(course, Path("/nonexistent.safetensors"), Limits()) as w:
        outcome = w.call("run", [[1, 2, 3]], 30, {"kind": "zero_cache_after_prefill"})
    assert outcome.kind == "returned", outcome.message
    assert float(outcome.value) == 0.0  # zeroed right after the aliased prefill returned
    assert outcome.probe == {"applied": True, "reason": "", "zeroed": 12}
    assert isinstance(outcome.cpu_seconds, float) and outcome.cpu_seconds >= 0


SPIN_AND_NAP = """
import time
def spin(n):
    end = time.thread_time() + n
    while time.thread_time() < end:
        pass
    return [1.0]
def nap(n):
    time.sleep(n)
    return [1.0]
"""

# what a submission can reach from inside its process: the clock, and the worker that replies
FORGER = """
import sys
_ticks = [0.0]
def _same_cost_every_time():
    _ticks[0] += 0.5
    return _ticks[0]
time.process_time = _same_cost_every_time
_worker = sys.modules["__main__"]
_honest = _worker.call_adapter
def _forged(*args, **named):
    reply = _honest(*args, **named)
    if reply.get("outcome") == "returned":
        reply["cpu_seconds"] = 0.01
        reply["probe"] = {"kind": "cpu_against", "cpu_seconds": 0.01,
                          "baseline_cpu_seconds": 1.0, "baseline_error": None}
    return reply
_worker.call_adapter = _forged
"""


def against_baseline(course: Path, case: tuple, baseline: tuple):
    with StudentProcess(course, Path("/nonexistent.safetensors"), Limits()) as process:
        probe = baseline_probe(*baseline)
        return call_against_baseline(process, *case, 30, probe)


def test_cpu_time_is_measured_by_the_grader_for_the_call_and_its_baseline(tmp_path):
    """Catches CPU time measured as wall time (a sleep costs no CPU), or the two calls'
    figures swapped or not recorded."""
    course = course_with(tmp_path, adapters=SPIN_AND_NAP)
    outcome = against_baseline(course, ("spin", [0.3]), ("nap", [0.3]))
    assert outcome.kind == "returned", outcome.message
    assert outcome.cpu_seconds >= 0.2 and outcome.probe["cpu_seconds"] == outcome.cpu_seconds
    assert outcome.probe["baseline_cpu_seconds"] < 0.1
    assert outcome.probe["baseline_error"] is None


def test_a_process_that_forges_its_clock_and_its_replies_fails_the_cost_check(tmp_path):
    """Catches CPU time taken from the student's process: this one makes time.process_time
    report the same cost for every call and rewrites the worker's replies to claim a cheap
    call against a dear baseline; its call truly costs 10x its baseline."""
    course = course_with(tmp_path, adapters=SPIN_AND_NAP + FORGER)
    outcome = against_baseline(course, ("spin", [1.0]), ("spin", [0.1]))
    assert outcome.kind == "returned", outcome.message
    assert outcome.probe["cpu_seconds"] >= 0.8 and outcome.probe["baseline_cpu_seconds"] < 0.5
    figures = {"steps": 16, "prompt": 512, "total": 528}
    verdict = cost_verdict(outcome.probe, say_for("per-step-identity"), figures)
    assert isinstance(verdict, Verdict) and verdict.status == Status.FAILED, verdict
    assert "recompute" in verdict.message


def test_a_baseline_that_fails_leaves_nothing_to_compare_and_never_passes(tmp_path):
    """Catches a failed baseline call read as a zero-cost one (any call would pass against it)."""
    course = course_with(tmp_path, adapters=SPIN_AND_NAP)
    outcome = against_baseline(course, ("spin", [0.1]), ("missing_adapter", []))
    assert "missing_adapter" in outcome.probe["baseline_error"]
    verdict = cost_verdict(outcome.probe, say_for("per-step-identity"), {"total": 3})
    assert isinstance(verdict, Verdict) and verdict.status == Status.FAILED


def course_with(tmp_path: Path, adapters: str, kvcache: str = "") -> Path:
    for folder in ("tests", "src"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "src" / "kvcache.py").write_text(textwrap.dedent(kvcache))
    (tmp_path / "tests" / "adapters.py").write_text(textwrap.dedent(adapters))
    return tmp_path


# --- end to end: cheats fail, correct layouts pass ----------------------------------------------


def cheat_params():
    fast = {"full-decode-step"}  # the structural probe: a 12-token prompt
    return [
        pytest.param(c, id=c["id"], marks=() if c["stage"] in fast else pytest.mark.slow)
        for c in CHEATS
    ]


@pytest.mark.parametrize("cheat", cheat_params())
def test_a_recompute_fails_its_stage_saying_it_recomputes(cheat, tmp_path, weights):
    """Catches a submission that gets the right numbers without using its cache."""
    course = make_course(tmp_path / "c", reference_text() + cheat["code"])
    case = grade_one(course, weights, cheat["stage"], cheat["case"])
    assert case.status == Status.FAILED, case
    assert "recompute" in case.message, case.message


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_correct_solution_passes_every_cache_use_case_in_any_layout(layout, tmp_path, weights):
    """Catches a cache-use check that only knows the reference's layout."""
    course = make_course(tmp_path / "c", (SOLUTIONS / layout).read_text())
    for slug in CACHED:
        case = grade_one(course, weights, slug, COST_CASE[slug])
        assert case.status == Status.PASSED, (slug, case.message)


def test_the_third_layout_passes_the_structural_probe(tmp_path, weights):
    """Catches a structural probe that needs mc.layers[l].k to be the stored array itself."""
    course = make_course(tmp_path / "c", (SOLUTIONS / "preallocated_kvcache.py").read_text())
    case = grade_one(course, weights, "full-decode-step", "reads the cache")
    assert case.status == Status.PASSED, case.message


@pytest.mark.slow
def test_the_third_layout_passes_every_stage(tmp_path, weights):
    """Catches a third layout that is not, in fact, correct (it would prove nothing)."""
    course = make_course(tmp_path / "c", (SOLUTIONS / "preallocated_kvcache.py").read_text())
    run = grade_course(course, weights, timeout=900)
    assert {s.slug: s.status.value for s in run.stages} == {s.slug: "passed" for s in load_stages()}
