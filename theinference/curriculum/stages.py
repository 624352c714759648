"""Stages are data: one TOML spec each in theinference/curriculum/specs/, named `<slug>.toml`.

A spec holds the title, order, prerequisites, tolerance, limits, score weight, the course's
guidance, the stage's words (hints the checks give, per situation), its cases, and how its
hidden cases are drawn. Long token sequences are described (`{ random = 1023, seed = 4 }`)
rather than listed, and expanded deterministically. Text may quote the spec's own values:
`{atol}`, `{rtol}` and any of its `[words]` by key, so nothing is retyped.
"""

import difflib
import re
import textwrap
import tomllib
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from theinference.oracle.config import ModelConfig
from theinference.results.compare import Tolerance

SPEC_DIR = Path(__file__).with_name("specs")
SPEC_FORMAT = 1
PLACEHOLDER = re.compile(r"\{(\w+)\}")
GPT2_VOCAB = 50257  # token ids in specs are GPT-2's


class StageError(Exception):
    """An unknown stage or a malformed spec; the message says which."""


@dataclass(frozen=True)
class Case:
    name: str
    check: str  # a key of theinference.curriculum.checks.CHECKS
    inputs: dict  # check-specific, e.g. {"prompt": ..., "next_id": ...}
    hidden: bool = False  # drawn from --seed, never shown to the student


@dataclass(frozen=True)
class Stage:
    slug: str
    title: str
    order: int
    requires: tuple[str, ...]
    tolerance: Tolerance
    timeout: float
    score: float
    guidance: str
    cases: tuple[Case, ...] = field(default=())
    hidden: dict = field(default_factory=dict)  # how --seed draws them (with_hidden_cases)
    memory_bytes: int | None = None  # the spec's memory_gb, else the run's limit
    output_bytes: int | None = None  # the spec's output_kb, else the run's limit
    words: dict = field(default_factory=dict)  # the checks' hints, tolerances quoted


def load_stages(spec_dir: Path = SPEC_DIR) -> list[Stage]:
    """Every stage, in course order."""
    stages = [_parse(path) for path in spec_dir.glob("*.toml")]
    stages.sort(key=lambda s: s.order)
    known = {s.slug for s in stages}
    for s in stages:
        for req in s.requires:
            if req not in known:
                raise StageError(f"stage {s.slug} requires unknown stage {req}")
    return stages


def stage_words(slug: str, spec_dir: Path = SPEC_DIR) -> dict[str, str]:
    """One stage's words, rendered: what its checks say to the student."""
    return _parse(spec_dir / f"{slug}.toml").words


def _parse(path: Path) -> Stage:
    try:
        spec = tomllib.loads(path.read_text())
        if spec.get("format") != SPEC_FORMAT:
            raise StageError(f"{path.name}: spec format {spec.get('format')} is not {SPEC_FORMAT}")
        tolerance = Tolerance(
            atol=float(spec["tolerance"]["atol"]), rtol=float(spec["tolerance"]["rtol"])
        )
        words = render_words(spec.get("words", {}), tolerance)
        return Stage(
            slug=path.stem,
            title=spec["title"],
            order=int(spec["order"]),
            requires=tuple(spec.get("requires", ())),
            tolerance=tolerance,
            timeout=float(spec.get("timeout", 60)),
            score=float(spec.get("score", 1)),
            guidance=rewrap(render(spec.get("guidance", "").strip(), words, tolerance)),
            cases=tuple(
                Case(name=c.pop("name"), check=c.pop("check"), inputs=c) for c in spec["cases"]
            ),
            hidden=dict(spec.get("hidden", {})),
            memory_bytes=int(spec["memory_gb"] * 2**30) if "memory_gb" in spec else None,
            output_bytes=int(spec["output_kb"] * 1024) if "output_kb" in spec else None,
            words=words,
        )
    except (KeyError, TypeError, ValueError, IndexError, tomllib.TOMLDecodeError) as exc:
        raise StageError(f"stage spec {path.name} is malformed: {exc!r}") from None


def render(text: str, words: dict, tolerance: Tolerance) -> str:
    """`{atol}`, `{rtol}` and `{word}` replaced by the spec's own values; any other braces
    (e.g. `{seconds:.1f}`, filled in when a check speaks) are left as they are."""
    values = {"atol": quoted(tolerance.atol), "rtol": quoted(tolerance.rtol), **words}
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def rewrap(text: str, width: int = 95) -> str:
    """Lines made long by a quoted word, wrapped again."""
    return "\n".join(
        textwrap.fill(line, width) if len(line) > width else line for line in text.splitlines()
    )


def quoted(x: float) -> str:
    """A tolerance as a spec writes it: 1e-4, not 0.0001."""
    if x == 0 or x >= 0.1:
        return f"{x:g}"
    mantissa, exponent = f"{x:e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def render_words(raw: dict, tolerance: Tolerance) -> dict[str, str]:
    """Words may quote the tolerance and the words defined before them."""
    done: dict[str, str] = {}
    for key, text in raw.items():
        done[key] = render(str(text).strip(), done, tolerance)
    return done


def select(stages: list[Stage], slugs: list[str]) -> list[Stage]:
    """The named stages in course order (all of them when none is named)."""
    if not slugs:
        return stages
    by_slug = {s.slug: s for s in stages}
    for slug in slugs:
        if slug not in by_slug:
            raise StageError(unknown_stage_message(slug, list(by_slug)))
    return [s for s in stages if s.slug in slugs]


def unknown_stage_message(slug: str, known: list[str]) -> str:
    near = difflib.get_close_matches(slug, known, n=1, cutoff=0.4)
    suggestion = f" Did you mean '{near[0]}'?" if near else ""
    return f"unknown stage '{slug}'.{suggestion} Stages: {', '.join(known)}"


def token_ids(spec, config: ModelConfig) -> list[int]:
    """Expand a token-sequence spec: a list of ids, `{ random = N, seed = S }` or
    `{ repeat = ID, times = N }`; lists may mix these (concatenated)."""
    if isinstance(spec, dict):
        if "random" in spec:
            # PCG64's raw stream is fixed across NumPy versions; ids are raw words mod vocab
            raw = np.random.PCG64(int(spec["seed"])).random_raw(int(spec["random"]))
            return [int(x) for x in raw % np.uint64(config.vocab_size)]
        if "repeat" in spec:
            return [int(spec["repeat"])] * int(spec["times"])
        raise StageError(f"unknown token sequence spec {spec}")
    ids: list[int] = []
    for item in spec:
        ids += token_ids(item, config) if isinstance(item, dict) else [int(item)]
    return ids


# --- hidden cases: drawn from the run's seed, as the spec's [hidden] table describes ---------


def with_hidden_cases(stage: Stage, seed: int) -> Stage:
    """Add the stage's hidden cases for `seed`. The spec's `[hidden]` table gives `count`,
    `check` and the inputs, where `{ random = [LO, HI] }` is a random sequence whose length
    lies in LO..HI, `{ between = [LO, HI] }` an integer, `{ token = "any" }` one token id, and
    `{ random = [LO, HI], as = "x" }` / `{ same = "x" }` one sequence used twice in a case.
    Every random number comes from the seed; the same seed always draws the same cases."""
    spec = dict(stage.hidden)
    if not spec:
        return stage
    count, check = int(spec.pop("count", 2)), spec.pop("check")
    drawn = []
    for i in range(count):
        stream = Draws(np.random.PCG64([seed, zlib.crc32(stage.slug.encode()), i]))
        inputs = {key: stream.draw(value) for key, value in spec.items()}
        drawn.append(Case(name=f"hidden case {i + 1}", check=check, inputs=inputs, hidden=True))
    return replace(stage, cases=stage.cases + tuple(drawn))


def drawn_per_run(case: Case) -> bool:
    """A case whose arguments a run draws (a cache-use proof): all of them (`draw`: it has
    none until then), or its floor's (`floor_draw`: stages.for_floor)."""
    return "draw" in case.inputs or "floor_draw" in case.inputs


def with_run_draws(stage: Stage, seed: int) -> Stage:
    """The stage with each case that has a `draw` table drawn for this run: the cache-use
    proofs' arguments, from the run's seed (--seed, else a fresh one per run), so that no
    submission can know them before its call. The table's values are as in `[hidden]`; a
    `floor_draw` table is drawn so too, into the case's `floor` (for_floor). Every case also
    gets the seed of its swapped cache, where its check swaps one."""
    cases = []
    for i, case in enumerate(stage.cases):
        stream = Draws(np.random.PCG64([seed, zlib.crc32(stage.slug.encode()), 1 << 20, i]))
        if (drawn := drawn_table(case, "draw", stream)) is not None:
            case = replace(case, inputs=drawn[0] | drawn[1] | {"drawn": True})
        if (drawn := drawn_table(case, "floor_draw", stream)) is not None:
            case = replace(case, inputs=drawn[0] | {"floor": drawn[1]})  # for_floor's
        if "swap" not in case.inputs:  # every case's swap (where its check swaps) is the run's
            case = replace(case, inputs=case.inputs | {"swap": stream.number(0, 2**31 - 1)})
        cases.append(case)
    return replace(stage, cases=tuple(cases))


def drawn_table(case: Case, name: str, stream: "Draws") -> tuple[dict, dict] | None:
    """(the case's inputs but its table `name`, that table drawn from `stream`), or None where
    the case has no such table."""
    template = case.inputs.get(name)
    if not isinstance(template, dict):
        return None
    rest = {k: v for k, v in case.inputs.items() if k != name}
    return rest, {k: stream.draw(v) for k, v in template.items()}


def for_floor(case: Case) -> Case:
    """The case as a call measured alone meets it: a cost proof tried over a fixed prompt
    (its K/V kept across runs: only its swap drawn) meets the floor on a prompt drawn for this
    run (its `floor`), which no earlier run saw, so that no answer kept from one can pass it."""
    floor = case.inputs.get("floor")
    if not isinstance(floor, dict):
        return case
    inputs = {k: v for k, v in case.inputs.items() if k != "floor"} | floor | {"drawn": True}
    return replace(case, inputs=inputs)


class Draws:
    """Concrete inputs from a hidden-case template, every number from one seeded stream."""

    def __init__(self, bits: np.random.PCG64):
        self.bits = bits
        self.named: dict[str, dict] = {}

    def number(self, low: int, high: int) -> int:
        # low..high inclusive, from PCG64's version-stable raw stream
        return low + int(self.bits.random_raw() % np.uint64(high - low + 1))

    def draw(self, value):
        if isinstance(value, list):
            return [self.draw(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "same" in value:
            return self.named[value["same"]]
        if "between" in value:
            return self.number(*value["between"])
        if "token" in value:
            return self.number(0, GPT2_VOCAB - 1)
        if isinstance(value.get("random"), list):
            out = {"random": self.number(*value["random"]), "seed": self.number(0, 2**31 - 1)}
            if "seed" in value:  # a length drawn, the tokens a fixed case's beginning
                out["seed"] = int(value["seed"])
            if "as" in value:
                self.named[value["as"]] = out
            return out
        return value
