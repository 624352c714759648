"""Which cases a run runs, in what order, when a stage stops early, and how a run of only some
cases is marked (partial) in results, progress and the machine formats."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from tests.bugs import planted
from tests.helpers import make_course
from theinference import exits
from theinference.cli import app
from theinference.results import CaseResult, RunResult, StageResult, Status

runner = CliRunner()


def stage_named(slug: str):
    from theinference.curriculum.stages import load_stages

    return next(s for s in load_stages() if s.slug == slug)


def test_every_case_is_sized_by_what_its_check_declares():
    """Would catch a check that declares no sizing inputs, or names one its cases do not have
    (its cases would all weigh nothing: a whole-context case run first and never left out)."""
    from theinference.curriculum.stages import load_stages, with_hidden_cases, with_run_draws
    from theinference.grading.policy import case_size

    for stage in load_stages():
        for case in with_run_draws(with_hidden_cases(stage, 7), 3).cases:
            assert case_size(case) > 0, (stage.slug, case.name)


def test_cases_run_smallest_first_and_long_ones_last():
    """Would catch: cases run in spec order (the 1024-token case before a one-token one), or a
    size measure that ignores continuations and the new tokens asked for."""
    from theinference.grading.policy import RunPolicy, case_size, plan

    for slug in ("single-step-attention", "per-step-identity", "generate-loop"):
        ordered = plan(stage_named(slug), RunPolicy()).cases
        sizes = [case_size(c) for c in ordered]
        assert sizes == sorted(sizes) and len(ordered) == len(stage_named(slug).cases)
    first = plan(stage_named("single-step-attention"), RunPolicy()).cases
    assert first[0].name == "one token" and "whole context" in first[-1].name
    gen = {c.name: case_size(c) for c in stage_named("generate-loop").cases}
    assert gen["64 tokens after a 16-token prompt"] == 16 + 64


def test_cases_beside_each_other_are_taken_from_both_ends_and_reported_in_order():
    """Would catch the cases beside each other dealt smallest first on every process (on two
    the longest then starts last and ends alone: the stage waits for 573 + 1024 tokens, not
    1024), the first process not taking a short case first (its verdict would come last) or
    taking the long ones smallest first (single-step-attention's 785-token case started last
    and ended alone), and the results handed back in the order they were taken rather than the
    cases'."""
    import threading

    from theinference.curriculum.stages import Case
    from theinference.grading.beside import grade_beside

    for sizes, first_two, third in (((10, 700, 1024), {10, 1024}, 700),  # 10 the first's
                                    ((400, 700, 1024), {1024, 700}, 400)):
        cases = [Case(f"{n}", "step_attention", {"seq": list(range(n))}) for n in sizes]
        taken: list[tuple[str, int]] = []
        first_taken = threading.Barrier(2)  # each process takes one case before either goes on

        def grade_one(case, process, taken=taken, barrier=first_taken):
            taken.append((process, int(case.name)))
            if len(taken) <= 2:
                barrier.wait(timeout=10)
            return case.name

        outputs = grade_beside(cases, ["first", "second"], grade_one, threading.Event())
        assert outputs == [c.name for c in cases]
        assert {n for _, n in taken[:2]} == first_two and taken[2][1] == third, taken
        assert ("second", 10) not in taken, taken


def test_the_first_process_takes_its_cases_while_the_others_start():
    """Would catch a batch of cases beside each other waiting for every process to start
    before the first takes any (single-step-attention's save paid a second process's start,
    0.3 to 0.5 s, before its small cases), and a process beside the first taking a case
    before its own start is done."""
    import threading

    from theinference.curriculum.stages import Case
    from theinference.grading.beside import grade_beside

    cases = [Case(f"{n} tokens", "step_attention", {"seq": list(range(n))}) for n in (5, 9, 400)]
    taken: list[tuple[str, str]] = []
    started, second_took = threading.Event(), threading.Event()

    def ready(process):
        if process == "second":
            started.wait(timeout=10)  # its start is slow: the first takes cases meanwhile

    def grade_one(case, process):
        taken.append((process, case.name))
        if process == "second":
            second_took.set()
        elif len(taken) == 2:
            started.set()
            second_took.wait(timeout=10)
        return case.name

    grade_beside(cases, ["first", "second"], grade_one, threading.Event(), ready)
    assert taken == [("first", "5 tokens"), ("first", "9 tokens"), ("second", "400 tokens")]


def test_quick_leaves_out_the_long_cases_only():
    """Would catch: --quick dropping small cases, keeping the whole-context ones, or dropping a
    cheap must-raise case."""
    from theinference.grading.policy import LONG_CASE_TOKENS, RunPolicy, case_size, plan

    stage = stage_named("generate-loop")
    quick = plan(stage, RunPolicy(quick=True))
    assert "up to the end of the context (1000 + 24 tokens)" in quick.left_out
    assert all(case_size(c) > LONG_CASE_TOKENS for c in stage.cases if c.name in quick.left_out)
    assert any("must raise" in c.name for c in quick.cases)
    kept = [c for c in quick.cases if "must_raise" not in c.inputs]
    assert all(case_size(c) <= LONG_CASE_TOKENS for c in kept)


def test_quick_keeps_every_swap_proof_drawn_no_longer_than_the_cases_it_keeps():
    """Would catch: --quick dropping a swapped-cache proof (a quick run would pass a
    recompute), or drawing it as long as the whole context (a 1000-token prefill in a run
    meant for iterating)."""
    from theinference.curriculum.stages import with_run_draws
    from theinference.grading.policy import RunPolicy, case_size, is_swap, plan, quick_draws

    for slug in ("single-step-attention", "full-decode-step", "per-step-identity"):
        stage = quick_draws(stage_named(slug))
        kept = plan(stage, RunPolicy(quick=True)).cases
        proofs = [c for c in kept if is_swap(c)]
        largest = max(case_size(c) for c in kept if not is_swap(c))
        assert len(proofs) == 1, slug
        for seed in range(20):
            (drawn,) = [c for c in with_run_draws(stage, seed).cases if is_swap(c)]
            assert 1 <= case_size(drawn) <= largest, (slug, seed, drawn.inputs)


def test_a_case_filter_that_selects_nothing_is_a_usage_error_naming_the_cases(template_course):
    """Would catch issue 10's forged pass: `--case nothing-matches` printing PASSED 0/0, exiting
    0 and recording the stage as passed."""
    result = runner.invoke(
        app, ["test", "-C", str(template_course), "-s", "build-prefill", "--case", "nothing"]
    )
    assert result.exit_code == exits.USAGE, result.output
    assert "Traceback" not in result.output
    assert "selects no case in build-prefill" in result.output
    assert "'one-token prompt'" in result.output and "'short prompt'" in result.output
    assert not (template_course / ".theinference" / "progress.json").exists()


def test_a_case_filter_selecting_nothing_anywhere_is_refused_too(template_course):
    """Would catch: with no --stage, a filter matching no case in any stage grading nothing."""
    result = runner.invoke(app, ["test", "-C", str(template_course), "--case", "zzz-none"])
    assert result.exit_code == exits.USAGE and "selects no case in any stage" in result.output


def test_quick_is_refused_with_machine_formats(template_course, tmp_path):
    """Would catch: a CI result (JSON, JUnit, Gradescope) computed on a subset of cases."""
    for extra in (["--format", "json"], ["--json", str(tmp_path / "r.json")]):
        result = runner.invoke(app, ["test", "-C", str(template_course), "--quick", *extra])
        assert result.exit_code == exits.USAGE and "--quick" in result.output
    assert not (tmp_path / "r.json").exists()


def test_a_first_case_todo_stops_its_stage_and_lists_the_rest(template_course, weights):
    """Would catch: a stage not yet started running every case (43 s of NotImplementedError),
    or the cases it skipped counted as todo evidence or as a partial verdict."""
    from tests.helpers import grade_course

    run = grade_course(template_course, weights, ["full-decode-step"])
    (stage,) = run.stages
    assert stage.status == Status.TODO and len(stage.cases) == 1
    assert stage.cases[0].name == "one-token prompt"  # the smallest case ran first
    assert len(stage.not_run) == len(stage_named("full-decode-step").cases) - 1
    assert not stage.partial and not run.partial


def test_watch_policy_stops_a_stage_at_its_first_failure(tmp_path, weights):
    """Would catch: the 1024-token case still running after the one-token case failed, a stage
    stopped early recorded as complete, or the diagnosis lost when the run stops early. A first
    numeric failure is followed by small cases up to a second one, which confirms the bug."""
    from theinference.grading.grader import RunPlan, grade
    from theinference.grading.policy import RunPolicy
    from theinference.student.setup import Limits, ProcessSetup

    course = make_course(tmp_path / "c", planted("missing-ln-f"))
    stage = replace(stage_named("build-prefill"), timeout=60)
    run = grade(ProcessSetup(course, weights.path, Limits(timeout=60)),
                RunPlan([stage], weights, policy=RunPolicy(stop_at_first_failure=True)))
    (result,) = run.stages
    failing = [c for c in result.cases if c.status == Status.FAILED]
    assert result.status == Status.FAILED and len(failing) == 2  # the failure, and its confirmation
    assert result.cases[-1] is failing[1]  # nothing ran after the confirming failure
    assert "the whole context (1024 tokens)" in result.not_run
    assert result.partial and run.partial
    assert result.suspected_bug == "missing-ln-f" and result.diagnosed
    assert "missing-ln-f" in result.candidates and "ln_f" in result.bug_name and result.hint


def partial_run(status: Status = Status.PASSED) -> RunResult:
    stage = StageResult(
        "single-step-attention",
        "t",
        status,
        [CaseResult(name="one token", status=status)],
        partial=True,
        not_run=["two tokens"],
    )
    from theinference.grading.environment import describe
    from theinference.grading.provenance import provenance, with_run
    from theinference.grading.seed import NO_SEED

    fields = with_run(provenance([stage.slug], None, "ab" * 32, NO_SEED), "bwrap")
    return RunResult([stage], "synthetic (x)", "ab" * 32, environment=describe(), sandbox="bwrap",
                     provenance=fields)


def test_a_partial_pass_is_never_recorded_as_passed(tmp_path):
    """Would catch: `theinference stages` showing a stage as passed after `--case one`."""
    from theinference.grading.progress import read_progress, record_progress

    record_progress(tmp_path, partial_run(Status.PASSED))
    assert read_progress(tmp_path) == {}
    record_progress(tmp_path, partial_run(Status.FAILED))  # a failure found is still news
    assert read_progress(tmp_path)["single-step-attention"]["status"] == "failed"


def test_machine_formats_mark_a_partial_run_and_never_give_it_marks():
    """Would catch: a Gradescope file from a filtered run scoring full marks, or JSON/JUnit/HTML
    that do not say the run was partial or which sandbox it had."""
    import xml.etree.ElementTree as ET

    import jsonschema

    from theinference.output.formats import FORMATS, SCHEMA_FILE, render

    run = partial_run()
    data = json.loads(render(run, "json"))
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))
    assert data["partial"] is True and data["sandbox"] == "bwrap"
    assert data["stages"][0]["partial"] is True and data["stages"][0]["not_run"] == ["two tokens"]
    grades = json.loads(render(run, "gradescope"))
    assert grades["score"] == 0 and sum(t["max_score"] for t in grades["tests"]) == 1.0
    assert "partial" in grades["tests"][0]["output"]
    props = {
        p.get("name"): p.get("value") for p in ET.fromstring(render(run, "junit")).iter("property")
    }
    assert props["partial"] == "true" and props["not_run"] == "1"
    assert "partial run" in render(run, "html")
    assert set(FORMATS) == {"json", "junit", "gradescope", "html"}


@pytest.mark.parametrize("fmt", ["json", "junit", "gradescope", "html"])
def test_every_registered_format_has_its_file_option(fmt):
    """Would catch: a format added to the registry that the command line does not offer."""
    result = runner.invoke(app, ["test", "--help"], terminal_width=200)
    assert f"--{fmt}" in result.output and fmt in result.output
