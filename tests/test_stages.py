"""The curriculum checks itself: specs, checks, template adapters and the contract agree."""

import ast

from theinference.course.directory import TEMPLATE_DIR
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.stages import load_stages, token_ids
from theinference.oracle.config import GPT2_124M

CONTRACT_TOLERANCES = {  # ../shared/course-contract.md
    "single-step-attention": (1e-4, 1e-3),
    "build-prefill": (1e-3, 1e-2),
    "full-decode-step": (1e-3, 1e-2),
    "per-step-identity": (1e-3, 1e-2),
    "generate-loop": (1e-3, 1e-2),
    "prefix-caching": (1e-3, 1e-2),
}


def template_adapters() -> set[str]:
    tree = ast.parse((TEMPLATE_DIR / "tests" / "adapters.py").read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_stages_follow_the_contract():
    stages = load_stages()
    # every stage of the contract, in its order; one it does not name yet is the course's own
    assert [s.slug for s in stages if s.slug in CONTRACT_TOLERANCES] == list(CONTRACT_TOLERANCES)
    for s in stages:
        if s.slug in CONTRACT_TOLERANCES:
            assert (s.tolerance.atol, s.tolerance.rtol) == CONTRACT_TOLERANCES[s.slug]
        assert s.guidance and s.cases and s.timeout > 0


def test_every_case_names_a_check_whose_adapter_the_template_defines():
    adapters = template_adapters()
    for s in load_stages():
        for case in s.cases:
            assert case.check in CHECKS, (s.slug, case.name)
            assert CHECKS[case.check].adapter in adapters, CHECKS[case.check].adapter


def test_prerequisites_come_earlier():
    seen = set()
    for s in load_stages():
        assert set(s.requires) <= seen, s.slug
        seen.add(s.slug)


def test_cases_cover_the_edges():
    ids_seen, lengths = set(), []
    for s in load_stages():
        for case in s.cases:
            for key in ("seq", "prompt"):
                if key in case.inputs:
                    ids = token_ids(case.inputs[key], GPT2_124M)
                    ids_seen |= set(ids)
                    lengths.append(len(ids) + ("next_id" in case.inputs))
                    assert all(0 <= i < GPT2_124M.vocab_size for i in ids)
    assert {0, 50256} <= ids_seen
    assert 1 in lengths and GPT2_124M.n_ctx in lengths  # one token, and the whole context


def test_random_sequences_are_fixed():
    ids = token_ids({"random": 5, "seed": 1}, GPT2_124M)
    assert ids == token_ids({"random": 5, "seed": 1}, GPT2_124M)
    assert ids == RANDOM_5_SEED_1


RANDOM_5_SEED_1 = [3486, 22978, 4282, 29665, 26443]  # PCG64 raw words mod vocab


def test_hidden_cases_stay_hidden():
    """Catches a hidden case that shows the seed in its name, is not marked hidden, or draws
    any of its inputs (continuations included) independently of the seed."""
    from theinference.curriculum.stages import with_hidden_cases

    for stage in load_stages():
        public = len(stage.cases)
        one = with_hidden_cases(stage, 11).cases[public:]
        two = with_hidden_cases(stage, 12).cases[public:]
        assert one and all(c.hidden for c in one), stage.slug
        assert all("11" not in c.name and "seed" not in c.name for c in one), stage.slug
        assert not any(c.hidden for c in stage.cases)
        for a, b in zip(one, two, strict=True):
            for key in a.inputs:
                assert a.inputs[key] != b.inputs[key], (stage.slug, key)


def test_hidden_prefix_caching_prompts_share_a_prefix():
    """Catches hidden prefix-caching cases that never reuse anything (they would test little)."""
    from theinference.curriculum.checks.prefix_caching import expected_reuse
    from theinference.curriculum.stages import with_hidden_cases

    (stage,) = [s for s in load_stages() if s.slug == "prefix-caching"]
    for case in with_hidden_cases(stage, 5).cases[len(stage.cases) :]:
        prompts = CHECKS[case.check].arguments(case, GPT2_124M)[0]
        assert max(expected_reuse(prompts)) >= 8, case.inputs
        assert all(len(p) + 1 <= GPT2_124M.n_ctx for p in prompts)
