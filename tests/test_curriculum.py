"""The curriculum checks itself, in the manner of rustlings' `dev check`: every stage is whole
(spec, checks module, template stubs and adapter, reference solution, a planted bug), every
catalogued bug is planted, and a stage lives in its own places only."""

import ast
import io
import re
import tokenize
from pathlib import Path

import theinference
from tests.bugs import BUGS
from tests.helpers import SOLUTIONS
from theinference.course.directory import TEMPLATE_DIR
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.stages import SPEC_DIR, load_stages
from theinference.diagnosis.bugs import PLACEHOLDER, bug_table
from theinference.diagnosis.fingerprints import catalogue
from theinference.diagnosis.variants import VARIANTS
from theinference.grading.verify import load_bugs

PACKAGE = Path(theinference.__file__).parent
ROOT = PACKAGE.parent
STAGES = load_stages()
TEMPLATE_KVCACHE = (TEMPLATE_DIR / "src" / "kvcache.py").read_text()
TEMPLATE_ADAPTERS = (TEMPLATE_DIR / "tests" / "adapters.py").read_text()
# other code that may name a stage, and why: bench times run_prefill and run_generate; the
# speed figure times run_generate, only for a submission whose generate loop passed
NAMED_ELSEWHERE = {("bench.py", "generate-loop"), ("speed.py", "generate-loop")}


def module_of(slug: str) -> Path:
    return PACKAGE / "curriculum" / "checks" / f"{slug.replace('-', '_')}.py"


def test_every_stage_has_its_spec_checks_module_stubs_adapter_solution_and_a_planted_bug():
    """Catches a stage added (or renamed) in one place and forgotten in another (a planted
    bug in Python and in TypeScript among them)."""
    adapters = {n.name for n in ast.parse(TEMPLATE_ADAPTERS).body if isinstance(n, ast.FunctionDef)}
    reference = (SOLUTIONS / "reference_kvcache.py").read_text()
    planted = {bug.stage for bug in BUGS}
    planted_ts = {bug.stage for bug in load_bugs(SOLUTIONS.with_name("solutions_ts") / "bugs.toml")}
    for stage in STAGES:
        assert (SPEC_DIR / f"{stage.slug}.toml").is_file(), stage.slug
        assert module_of(stage.slug).is_file(), f"no checks module for {stage.slug}"
        own = [c for c in CHECKS.values() if c.stage == stage.slug]
        assert own, f"{module_of(stage.slug).name} declares no check"
        assert all(c.description for c in own), "every check says what it checks (docstring)"
        for case in stage.cases:
            assert CHECKS[case.check].stage == stage.slug, (stage.slug, case.name, case.check)
            assert CHECKS[case.check].adapter in adapters, CHECKS[case.check].adapter
        stubs = re.findall(rf'NotImplementedError\(\s*"{re.escape(stage.slug)}: ', TEMPLATE_KVCACHE)
        assert stubs, f"no stub in the template names {stage.slug}"
        assert stage.slug in planted, f"no planted bug fails {stage.slug}"
        assert stage.slug in planted_ts, f"no planted TypeScript bug fails {stage.slug}"
    assert "class PrefixCache" in reference and "def prefill" in reference


def test_every_stage_has_its_row_in_the_students_tables():
    """Catches a stage added without its row in README's table of stages or in
    docs/reference.md's table of adapters: its students would find it in neither."""
    for page in (ROOT / "README.md", ROOT / "docs" / "reference.md"):
        rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", page.read_text(), re.M))
        missing = [s.slug for s in STAGES if s.slug not in rows]
        assert not missing, f"{page.name} has no row for {missing}"


def test_every_catalogued_bug_is_planted_and_named():
    """Catches a fingerprint the grader can name that no planted bug proves it names."""
    named = {bug.fingerprint for bug in BUGS if bug.fingerprint}
    missing = sorted(b.id for b in catalogue() if b.id not in named)
    assert not missing, f"catalogued bugs with no planted bug in bugs.toml: {missing}"


def test_every_stub_in_the_template_names_a_stage():
    """Catches a stub whose NotImplementedError would not tell the student which stage it is."""
    slugs = {s.slug for s in STAGES}
    messages = re.findall(r'NotImplementedError\(\s*"([^"]*)"', TEMPLATE_KVCACHE)
    assert messages
    for message in messages:
        assert message.split(":")[0] in slugs, message


def test_a_stage_slug_appears_in_code_only_in_its_own_checks_module():
    """Catches stage knowledge leaking into shared code (what would make adding a stage touch
    more than its TOML, checks module, template and solutions). Docstrings and comments may
    mention a stage as an example; code may not."""
    for path in PACKAGE.rglob("*.py"):
        if TEMPLATE_DIR.parent in path.parents:  # every language's template names its stages
            continue
        literals = code_strings(path.read_text())
        for stage in STAGES:
            if path == module_of(stage.slug) or (path.name, stage.slug) in NAMED_ELSEWHERE:
                continue
            assert not [s for s in literals if stage.slug in s], (path.name, stage.slug)


def code_strings(source: str) -> list[str]:
    """Every string literal that is not a docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            docstrings.add(first.value.lineno)
    return [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.STRING and tok.start[0] not in docstrings
    ]


def test_order_and_slug_are_stated_once():
    """Catches a spec restating its slug or carrying an order that clashes with another's."""
    for path in SPEC_DIR.glob("*.toml"):
        assert not re.search(r"^slug\s*=", path.read_text(), re.M), path.name
    orders = [s.order for s in STAGES]
    assert len(set(orders)) == len(orders)


def test_tolerances_are_quoted_from_the_spec_never_retyped():
    """Catches a tolerance typed into prose (it would go stale when the spec's changes)."""
    for path in SPEC_DIR.glob("*.toml"):
        prose = [line for line in path.read_text().splitlines() if "tolerance =" not in line]
        assert not re.search(r"\b\d(\.\d+)?e-\d\b", "\n".join(prose)), path.name
    for path in (PACKAGE / "curriculum" / "checks").glob("*.py"):
        assert not re.search(r"\b\d(\.\d+)?e-\d\b", path.read_text()), path.name
    (stage,) = [s for s in STAGES if s.slug == "single-step-attention"]
    assert f"atol {stage.tolerance.atol:.0e}".replace("e-0", "e-") in stage.guidance
    assert "{atol}" not in stage.guidance and "{" not in stage.words["mismatch"]


def test_each_stage_says_its_words_once():
    """Catches the same hint written in two places (two TOMLs, or a TOML and a module); within
    a stage, words quote each other by name ({handoff})."""
    owner: dict[str, str] = {}
    for stage in STAGES:
        for text in [stage.guidance, *stage.words.values()]:
            for sentence in re.split(r"(?<=[.:;])\s+", " ".join(text.split())):
                if len(sentence) > 60:
                    assert owner.setdefault(sentence, stage.slug) == stage.slug, sentence
    for path in (PACKAGE / "curriculum" / "checks").glob("*.py"):
        for literal in code_strings(path.read_text()):
            assert "classic" not in literal and "handoff" not in literal.lower(), path.name


def test_every_stage_draws_hidden_cases():
    """Catches a stage whose hidden cases were forgotten (prefix-caching had none)."""
    for stage in STAGES:
        assert stage.hidden.get("check") in CHECKS, stage.slug


REFERENCE = ROOT / "docs" / "reference.md"
BUG_LIST = re.compile(r"<!-- bugs: .*? -->\n(.*?)\n<!-- /bugs -->", re.S)


def how_recognised(bug) -> str:
    ways = [*(["its numbers"] if bug.variant else []), *(["its error"] if bug.errors else [])]
    return ", ".join(ways) or "its check, by itself"


def readme_bug_rows() -> list[str]:
    """docs/reference.md's list of the classic bugs, as the table says it."""
    rows = ["| bug | what the code does | named from |", "| --- | --- | --- |"]
    rows += [f"| `{b.id}` | {b.name()} | {how_recognised(b)} |" for b in bug_table().values()]
    return rows


def test_the_bug_table_holds_to_the_variants_the_checks_and_the_planted_bugs():
    """Catches a bug added in one place and forgotten in another: a variant no bug uses (or a
    bug naming a missing one), a check that does not exist, a bug the grader can name by its
    numbers or by a check that no planted bug in tests/solutions/bugs.toml proves it names, a
    planted bug expecting a name the table does not have, an error signature that does not
    compile, or a bug that nothing could ever recognise."""
    table = bug_table()
    used = [b.variant for b in table.values() if b.variant]
    assert sorted(used) == sorted(VARIANTS), set(used) ^ set(VARIANTS)
    planted = {bug.fingerprint for bug in BUGS if bug.fingerprint}
    assert planted <= set(table), planted - set(table)
    for bug in table.values():
        assert set(bug.checks) <= set(CHECKS), (bug.id, set(bug.checks) - set(CHECKS))
        assert bug.variant or bug.errors or bug.checks, f"{bug.id}: nothing can recognise it"
        if not bug.errors:  # named as a suspected bug: a planted bug proves it
            assert bug.id in planted, f"{bug.id} has no planted bug in bugs.toml"
        for sig in bug.errors:
            for pattern in (sig.exception, sig.message, sig.where):
                re.compile(pattern)
            assert sig.means, bug.id


def test_a_bugs_words_quote_the_models_sizes_never_type_them():
    """Catches "reshape(n, 12, 64)" typed into a hint: it would be wrong for any other GPT-2
    size; and a placeholder the table's renderer does not know."""
    from theinference.oracle.config import ModelConfig

    other = ModelConfig(n_layer=24, n_embd=1024, vocab_size=50257, n_ctx=1024)
    for bug in bug_table().values():
        for text in [*bug.names.values(), *bug.hints.values(), *(e.means for e in bug.errors)]:
            assert not re.search(r"\b(8|12|64|768|1024|50257)\b", text), (bug.id, text)
        for language in bug.hints:
            rendered = bug.hint(language, other) + bug.name(language, other)
            assert not PLACEHOLDER.search(rendered), (bug.id, rendered)


def test_reference_lists_every_bug_of_the_table():
    """Catches docs/reference.md's bug list drifting from the table (a bug added, renamed or
    dropped)."""
    found = BUG_LIST.search(REFERENCE.read_text())
    assert found, "docs/reference.md has no bug list between <!-- bugs: ... --> and <!-- /bugs -->"
    expected = "\n".join(readme_bug_rows())
    assert found.group(1) == expected, f"docs/reference.md's bug list should read:\n{expected}"


def test_hint_lists_the_stages_classic_bugs_from_the_table():
    """Catches `theinference hint STAGE` missing a bug the table says concerns that stage."""
    from typer.testing import CliRunner

    from theinference.cli import app

    out = CliRunner().invoke(app, ["hint", "full-decode-step"], terminal_width=200).stdout
    for bug in bug_table().values():
        stages = {CHECKS[c].stage for c in bug.checks}
        assert (bug.name() in out) == ("full-decode-step" in stages), bug.id
