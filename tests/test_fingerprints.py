"""Fingerprints name a bug only on clear evidence: never a nearly correct answer, confirmed on a
second case, every candidate when several fit, and two bugs at once when both are catalogued."""

import numpy as np
import pytest

from tests.bugs import BUGS
from tests.helpers import oracle_answer
from theinference.curriculum.checks import CHECKS
from theinference.diagnosis.bugs import bug_table
from theinference.diagnosis.fingerprints import catalogue, combined
from theinference.diagnosis.fingerprints import match_catalogue as diagnose
from theinference.diagnosis.variants import VARIANTS
from theinference.oracle.cached_path import CachedPath
from theinference.oracle.config import GPT2_124M
from theinference.results.compare import Tolerance

STEP_TOL = Tolerance(atol=1e-4, rtol=1e-3)
LOGITS_TOL = Tolerance(atol=1e-3, rtol=1e-2)
BY_ID = bug_table()


def simulate(check: str, args: list, w: dict, n_layer: int, variant):
    """A case along the cached path with a bug's variant (GPT-2's own where that is None)."""
    return CachedPath(w, n_layer).answer(CHECKS[check].simulate, args, variant)


def words(found) -> tuple[str, str]:
    return found.words("python", GPT2_124M)


def moved(expected: np.ndarray, tol: Tolerance, by: float, seed: int, everywhere=True):
    """The answer moved `by` tolerances away: at every element (random signs) or at one."""
    allowed = tol.atol + tol.rtol * np.abs(expected.astype(np.float64))
    rng = np.random.default_rng(seed)
    push = np.zeros_like(allowed)
    if everywhere:
        push = rng.choice([-1.0, 1.0], size=allowed.shape)
    else:
        push.flat[rng.integers(allowed.size)] = 1.0
    return (expected + by * push * allowed).astype(np.float32)


ONE_TOKEN_CASES = [
    ("step_attention", [[464]], STEP_TOL),
    ("prefill_logits", [[464]], LOGITS_TOL),
    ("decode_step", [[464], 2068], LOGITS_TOL),
    ("decode_sequence", [[464], [2068, 318]], LOGITS_TOL),
]


@pytest.mark.parametrize("everywhere", [True, False], ids=["every-element", "one-element"])
@pytest.mark.parametrize("check,args,tol", ONE_TOKEN_CASES, ids=[c[0] for c in ONE_TOKEN_CASES])
def test_an_answer_just_past_the_tolerance_accuses_no_bug(weights, check, args, tol, everywhere):
    """Catches naming a bug for a nearly correct answer: on one-token cases several variants
    equal GPT-2 (one key: no scale, a wrong head split, no prefill mask change nothing), so an
    answer 1.005x past the tolerance sits within the tolerance of them by float noise alone."""
    w, n_layer = weights.tensors, weights.config.n_layer
    expected = oracle_answer(check, args, w, n_layer)
    actual = moved(expected, tol, 1.005, seed=1, everywhere=everywhere)
    diagnosis = diagnose([(check, args, actual)], tol, w, weights.config)
    assert diagnosis.bug is None and diagnosis.candidates == [], diagnosis
    assert words(diagnosis) == ("", "")


def test_a_bug_is_confirmed_on_a_second_failing_case(weights):
    """Catches naming a bug from one case: the smallest case is exactly position-zero's
    numbers, but the second failing case is not, so nothing is named."""
    w, n_layer, c = weights.tensors, weights.config.n_layer, weights.config
    first = [[15496, 11, 616], 318]
    second = [[0, 0], 50256]
    zero = VARIANTS["position-zero"]
    unknown = moved(oracle_answer("decode_step", second, w, n_layer), LOGITS_TOL, 30.0, seed=2)
    failures = [
        ("decode_step", first, simulate("decode_step", first, w, n_layer, zero)),
        ("decode_step", second, unknown),
    ]
    assert diagnose(failures[:1], LOGITS_TOL, w, c).bug is BY_ID["position-zero"]
    diagnosis = diagnose(failures, LOGITS_TOL, w, c)
    assert diagnosis.bug is None and diagnosis.cases_tried == 2, diagnosis


def test_bugs_with_the_same_numbers_are_all_candidates(weights):
    """Catches a silent catalogue-order tie-break: after a one-token prompt, a position stuck
    at len(prompt) and a position of 1 are the same numbers, so both are named, neither
    chosen."""
    w, n_layer = weights.tensors, weights.config.n_layer
    args = [[464], [2068, 318, 11]]
    actual = simulate("decode_sequence", args, w, n_layer, VARIANTS["position-one"])
    diagnosis = diagnose([("decode_sequence", args, actual)], LOGITS_TOL, w, weights.config)
    assert diagnosis.bug is None
    assert {b.id for b in diagnosis.candidates} == {"position-one", "position-not-advancing"}
    name, hint = words(diagnosis)
    assert name.startswith("one of") and "wpe[1]" in name and "position-one" not in name + hint


def test_two_catalogued_bugs_at_once_are_both_named(weights):
    """Catches "no known bug matches" for a cache with two known bugs (an erf GELU and a causal
    mask aligned top-left in the decode, as a public nanoGPT-based KV cache has): neither alone
    reproduces the answer, the pair does; the mask, the larger, is the stage's bug."""
    w, n_layer = weights.tensors, weights.config.n_layer
    both = combined((BY_ID["causal-mask-in-step"], BY_ID["erf-gelu"]))
    cases = [[[464], 2068], [[0, 0], 50256]]  # on the first, attend-old-length ties the mask
    failures = [("decode_step", a, simulate("decode_step", a, w, n_layer, both)) for a in cases]
    diagnosis = diagnose(failures, LOGITS_TOL, w, weights.config)
    assert diagnosis.several and diagnosis.bug is BY_ID["causal-mask-in-step"], diagnosis
    assert [b.id for b in diagnosis.candidates] == ["causal-mask-in-step", "erf-gelu"]
    assert "two known bugs at once" in words(diagnosis)[1]


def test_the_largest_of_several_bugs_is_named_as_such(weights):
    """Catches silence where one catalogued bug explains nearly all of an answer that also has
    an unknown error: it is named as the largest of several, not as the whole story."""
    w, n_layer = weights.tensors, weights.config.n_layer
    zero = VARIANTS["position-zero"]
    failures = [
        ("decode_step", a, moved(simulate("decode_step", a, w, n_layer, zero), LOGITS_TOL, 3, i))
        for i, a in enumerate([[[15496, 11, 616], 318], [[0, 0], 50256]])
    ]
    diagnosis = diagnose(failures, LOGITS_TOL, w, weights.config)
    assert diagnosis.several and diagnosis.bug is BY_ID["position-zero"], diagnosis
    assert diagnosis.candidates == [BY_ID["position-zero"]]
    assert "largest of several" in words(diagnosis)[1]


def test_every_catalogued_bug_has_a_planted_bug_it_names():
    """Catches a catalogue entry nothing exercises: each must be some planted bug's expected
    fingerprint in tests/solutions/bugs.toml, so verify proves the grader names it."""
    named = {b.fingerprint for b in BUGS}
    assert {b.id for b in catalogue()} <= named, {b.id for b in catalogue()} - named


def test_the_two_bug_plant_is_named_at_stage_level(tmp_path, weights, answers):
    """Catches a stage result without its diagnosis: grading the nanoGPT-style plant sets the
    stage's suspected bug, both candidates and the hint that names both."""
    from tests.bugs import planted
    from tests.helpers import grade_course, make_course

    course = make_course(tmp_path / "c", planted("nanogpt-erf-gelu-and-step-mask"))
    # as `verify --quick` plants it: the short cases name both bugs
    (stage,) = grade_course(course, weights, ["full-decode-step"], oracle=answers,
                            quick=True).stages
    assert stage.status.value == "failed"
    assert stage.suspected_bug == "causal-mask-in-step"
    assert stage.candidates == ["causal-mask-in-step", "erf-gelu"]
    assert "two known bugs at once" in stage.hint and stage.bug_name
