"""Correct caches in every layout a strong student writes pass every cache-use proof and
every stage, in every sandbox mode: the proofs rest on evidence every correct cache shows
(its K/V rows, found by content; its CPU time), never on its layout or its names. Every
layout passes the swaps; every stage, the full-size proofs and the other sandbox modes are
graded on the layouts furthest from the reference (the reference's own: tests/test_grading.py).
The in-process grades share the run's seed and the oracle's answers (tests/conftest.py), so
a case two layouts are asked is answered once. Each solution's numbers are checked against
the oracle outside the grader by tests/solutions/check_layouts.py."""

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import SOLUTIONS, installed, make_course, with_template_stubs
from tests.test_cache_use import FLOORED, SWAPPED, grade_proofs
from theinference.curriculum.stages import load_stages
from theinference.results import Status
from theinference.student import sandbox
from theinference.student.setup import Limits, ProcessSetup

LAYOUTS = [
    "reference_kvcache.py",
    "independent_kvcache.py",
    "preallocated_kvcache.py",
    "torch_kvcache.py",
    # the layouts strong students write (tests/solutions/check_layouts.py checks their numbers
    # against the oracle outside the grader)
    "fused_kvcache.py",
    "paged_kvcache.py",
    "readonly_kvcache.py",
    "linked_kvcache.py",
    "prescaled_kvcache.py",
    "arena_kvcache.py",
    "per_token_kvcache.py",
    "interleaved_kvcache.py",
    "torch_module_kvcache.py",
    "held_everywhere_kvcache.py",  # each layer in memory of another kind, or where few look
    "transformers_kvcache.py",  # transformers' GPT-2 and DynamicCache: no function named prefill
    "jax_kvcache.py",  # JAX arrays, immutable, a new one each step, in buffers of JAX's own
]
OWN_ADAPTERS = {"transformers_kvcache.py": "transformers_adapters.py"}  # its tests/adapters.py
NEEDS = {"torch_kvcache.py": ["torch"], "torch_module_kvcache.py": ["torch"],
         "transformers_kvcache.py": ["torch", "transformers"], "jax_kvcache.py": ["jax"]}
# every stage (not only its swaps), the full-size proofs and a uid of their own: the layouts
# furthest from the reference. The reference's every stage and full-size proof:
# tests/test_grading.py; the paged solution's (NumPy blocks) every case of the first three
# stages at full size: tests/test_class_grade_slow.py
EVERY_STAGE = ["independent_kvcache.py", "transformers_kvcache.py"]  # float64 and loops; PyTorch
SHORT = 64  # tokens: the every-stage grade's longest case but for its swaps and refusals
# at full size: the swaps in a buffer of the whole context and a chain of a thousand nodes;
# the floors' stages on the slowest correct cache here, transformers' (their proofs swap its
# PyTorch cache of a thousand tokens first; the reference's every full-size proof:
# tests/test_grading.py)
FULL_SIZE = {"preallocated_kvcache.py": SWAPPED, "linked_kvcache.py": SWAPPED,
             "transformers_kvcache.py": FLOORED}
# as a uid of their own too (every layout passes as the grader's own user): NumPy blocks behind a
# table, and PyTorch (its threads, its own allocator)
EVERY_MODE = ["paged_kvcache.py", "transformers_kvcache.py"]


def layouts(names: list[str]) -> list:
    """The layouts as parameters, those kept in PyTorch skipped where it is not installed."""
    return [
        pytest.param(name, marks=pytest.mark.skipif(
            not all(installed(m) for m in NEEDS.get(name, [])),
            reason=f"{name} needs {' and '.join(NEEDS.get(name, []))} (.ci/run installs them)"))
        for name in names
    ]


def layout_course(root: Path, layout: str) -> Path:
    """A course holding a solution's src/kvcache.py and its own tests/adapters.py if any, else
    the template's adapters (and its stubs for any stage the solution leaves out)."""
    kvcache = (SOLUTIONS / layout).read_text()
    course = make_course(root, kvcache if layout in OWN_ADAPTERS else with_template_stubs(kvcache))
    if layout in OWN_ADAPTERS:
        adapters = (SOLUTIONS / OWN_ADAPTERS[layout]).read_text()
        (course / "tests" / "adapters.py").write_text(adapters)
    return course


@pytest.mark.parametrize("layout", layouts(LAYOUTS))
def test_a_correct_cache_in_any_layout_passes_the_swaps(
    layout, tmp_path, weights, answers, run_seed
):
    """Catches a swap that only finds the reference's layout: float64 buffers, a preallocated
    buffer behind copying properties, PyTorch tensors, fused K|V, blocks behind a table,
    read-only arrays, linked nodes, pre-scaled keys, an arena, per-token rows, interleaved
    heads, a module's buffers, K/V held by a module-level pool, a class attribute, a generator,
    complex, integer, raw-byte, ctypes, list, structured, object and head-minor memory,
    transformers' DynamicCache with no function named prefill, JAX arrays."""
    course = layout_course(tmp_path / "c", layout)
    cases = grade_proofs(course, weights, SWAPPED, True, answers=answers, seed=run_seed)
    assert len(cases) == len(SWAPPED)
    for slug, case in zip(SWAPPED, cases, strict=True):
        assert case.status == Status.PASSED, (slug, case.message)


@pytest.mark.slow
@pytest.mark.parametrize("layout", layouts(EVERY_STAGE))
def test_a_correct_cache_in_any_layout_passes_every_stage(
    layout, tmp_path, weights, answers, run_seed
):
    """Catches a verdict that depends on the layout anywhere in the curriculum: every stage's
    short graded cases (every decode among them swapped) and its swap proofs, as a quick run
    grades them, but for the cases of more than SHORT tokens (the same calls, longer: the
    layouts' every case at full size is tests/test_class_grade_slow.py's, the paged one's)."""
    from theinference.grading.grader import RunPlan, grade
    from theinference.grading.policy import RunPolicy, case_size, is_swap

    course = layout_course(tmp_path / "c", layout)
    short = [c.name for s in load_stages() for c in s.cases
             if case_size(c) <= SHORT or is_swap(c) or "must_raise" in c.inputs]
    stages = [replace(s, timeout=300) for s in load_stages()]
    run = grade(ProcessSetup(course, weights.path, Limits(timeout=300)),
                RunPlan(stages, weights, answers, RunPolicy(quick=True, cases=tuple(short)),
                        run_seed))
    for stage in run.stages:
        bad = [(c.name, c.message) for c in stage.cases if c.status != Status.PASSED]
        assert stage.status == Status.PASSED and not bad, (stage.slug, bad)
        assert sum(c.status == Status.PASSED for c in stage.cases) >= 3, stage.slug


@pytest.mark.slow
@pytest.mark.parametrize("layout", layouts(list(FULL_SIZE)))
def test_a_correct_cache_in_any_layout_passes_every_full_size_proof(
    layout, tmp_path, weights, answers, run_seed
):
    """Catches a proof that a correct cache fails at the sizes the stages draw (a floor too
    tight, a swap lost in a 1000-token cache)."""
    course = layout_course(tmp_path / "c", layout)
    slugs = FULL_SIZE[layout]
    cases = grade_proofs(course, weights, slugs, answers=answers, seed=run_seed)
    assert len(cases) == len(slugs)
    for slug, case in zip(slugs, cases, strict=True):
        assert case.status == Status.PASSED, (slug, case.message)


@pytest.mark.slow
@pytest.mark.parametrize("layout", layouts(EVERY_MODE))
def test_a_correct_cache_passes_the_swaps_as_a_uid_of_its_own(
    layout, tmp_path, weights, answers, run_seed
):
    """Catches a swap that works only inside bubblewrap (the default elsewhere) or as the
    grader's own user (every in-process grade's, test_a_correct_cache_in_any_layout_passes_
    the_swaps among them): a uid of the student's own."""
    chosen = sandbox.choose("none")  # as root: the unprivileged-user mode
    assert chosen.kind == "unprivileged-user" or os.geteuid() != 0, chosen
    course = layout_course(tmp_path / "c", layout)
    cases = grade_proofs(course, weights, SWAPPED, True, chosen, answers, run_seed)
    assert len(cases) == len(SWAPPED)
    for case in cases:
        assert case.status == Status.PASSED, (case.name, case.message)
