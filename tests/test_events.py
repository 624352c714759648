"""A run reports its progress as events, in order, and returns the same results it reported."""

from tests.helpers import grade_course


def test_events_arrive_in_order_and_carry_the_results(reference_course, weights, answers):
    """Would catch: a listener never called, events out of order (a case finishing before it
    started, a stage finishing twice), or results reported that differ from those returned."""
    from theinference.results import events

    seen = []
    run = grade_course(reference_course, weights, ["single-step-attention", "build-prefill"],
                       oracle=answers, listener=seen.append, quick=True)
    kinds = [type(e).__name__ for e in seen]
    assert kinds[0] == "RunStarted" and kinds[-1] == "RunFinished"
    assert seen[0].stages == ("single-step-attention", "build-prefill")
    assert seen[-1].result is run
    finished_stages = [e.result for e in seen if isinstance(e, events.StageFinished)]
    assert finished_stages == run.stages
    for stage in run.stages:
        started = [e for e in seen if isinstance(e, events.CaseStarted) and e.stage == stage.slug]
        finished = [e for e in seen if isinstance(e, events.CaseFinished) and e.stage == stage.slug]
        assert [e.index for e in started] == list(range(len(stage.cases)))
        assert [e.result for e in finished] == stage.cases
        assert all(e.total == len(stage.cases) for e in started)
    # each case starts, then finishes, before the next one starts
    case_kinds = [k for k in kinds if k.startswith("Case")]
    assert case_kinds == ["CaseStarted", "CaseFinished"] * (len(case_kinds) // 2)
