"""Stages are data: one TOML spec each in theinference/stages/, joined by name to a check.

A spec holds the slug, title, order, prerequisites, tolerance, limits, score weight, the
course's guidance, and its cases. Cases name their inputs; long token sequences are
described (`{ random = 1023, seed = 4 }`) rather than listed, and expanded deterministically.
"""

import difflib
import tomllib
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from theinference.compare import Tolerance
from theinference.config import ModelConfig

SPEC_DIR = Path(__file__).with_name("stages")
SPEC_FORMAT = 1


class StageError(Exception):
    """An unknown stage or a malformed spec; the message says which."""


@dataclass(frozen=True)
class Case:
    name: str
    check: str  # a key of theinference.checks.CHECKS
    inputs: dict  # check-specific, e.g. {"prompt": ..., "next_id": ...}
    hidden: bool = False  # drawn from --seed, not a public case


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
    hidden: dict = field(default_factory=dict)  # {check, count, min_len, max_len} for --seed
    memory_bytes: int | None = None  # the spec's memory_gb, else the run's limit
    output_bytes: int | None = None  # the spec's output_kb, else the run's limit


def load_stages(spec_dir: Path = SPEC_DIR) -> list[Stage]:
    """Every stage, in course order."""
    stages = [_parse(path) for path in sorted(spec_dir.glob("*.toml"))]
    stages.sort(key=lambda s: s.order)
    known = {s.slug for s in stages}
    for s in stages:
        for req in s.requires:
            if req not in known:
                raise StageError(f"stage {s.slug} requires unknown stage {req}")
    return stages


def _parse(path: Path) -> Stage:
    try:
        spec = tomllib.loads(path.read_text())
        if spec.get("format") != SPEC_FORMAT:
            raise StageError(f"{path.name}: spec format {spec.get('format')} is not {SPEC_FORMAT}")
        return Stage(
            slug=spec["slug"],
            title=spec["title"],
            order=int(spec["order"]),
            requires=tuple(spec.get("requires", ())),
            tolerance=Tolerance(
                atol=float(spec["tolerance"]["atol"]), rtol=float(spec["tolerance"]["rtol"])
            ),
            timeout=float(spec.get("timeout", 60)),
            score=float(spec.get("score", 1)),
            guidance=spec.get("guidance", "").strip(),
            cases=tuple(
                Case(name=c.pop("name"), check=c.pop("check"), inputs=c) for c in spec["cases"]
            ),
            hidden=dict(spec.get("hidden", {})),
            memory_bytes=int(spec["memory_gb"] * 2**30) if "memory_gb" in spec else None,
            output_bytes=int(spec["output_kb"] * 1024) if "output_kb" in spec else None,
        )
    except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as exc:
        raise StageError(f"stage spec {path.name} is malformed: {exc!r}") from None


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


def with_hidden_cases(stage: Stage, seed: int) -> Stage:
    """Add the stage's hidden cases for `seed`: random prompts drawn from the same distribution
    as the public ones, so a submission tuned to the public cases is still checked. The same
    seed always draws the same cases."""
    spec = stage.hidden
    if not spec:
        return stage
    drawn = []
    for i in range(int(spec.get("count", 2))):
        raw = np.random.PCG64([seed, zlib.crc32(stage.slug.encode()), i]).random_raw(3)
        low, high = int(spec["min_len"]), int(spec["max_len"])
        length = low + int(raw[0] % np.uint64(high - low + 1))
        ids = {"random": length, "seed": int(raw[1] % np.uint64(2**31))}
        inputs = {spec.get("input", "prompt"): ids}
        extras = spec.get("extra", [])
        if "next_id" in extras:
            inputs["next_id"] = int(raw[2] % np.uint64(50257))
        if "continuation" in extras:  # 1..32 teacher-forced steps
            inputs["continuation"] = {"random": 1 + int(raw[2] % np.uint64(32)), "seed": i}
        if "max_new_tokens" in extras:
            inputs["max_new_tokens"] = 1 + int(raw[2] % np.uint64(32))
        drawn.append(
            Case(
                name=f"hidden case {i + 1} (seed {seed}, {length} tokens)",
                check=spec["check"],
                inputs=inputs,
            )
        )
    return replace(stage, cases=stage.cases + tuple(drawn))
