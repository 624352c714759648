"""What produced a grade: the grader's version, each stage spec and the course settings (by
hash), the weights, where the hidden cases' seed came from, the sandbox and the platform.

Two results that differ tell why by these fields (`gradebook diff`): a changed spec is a
changed tolerance or case list, a changed seed a new draw of hidden cases, a changed content
hash (the records' own) a resubmission. The seed itself is never written: only its source and
a short hash that tells two seeds apart (a hash of a small number is no secret from someone
who tries every number: the records stay the instructor's).
"""

import hashlib
import os
import platform

from theinference import __version__
from theinference.curriculum.stages import SPEC_DIR

SEED_VAR = "THEINFERENCE_SEED"


def short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def spec_hashes(slugs) -> dict[str, str]:
    """Each graded stage's spec file, hashed: a tolerance, a case or a limit changed shows."""
    return {slug: short_hash((SPEC_DIR / f"{slug}.toml").read_bytes()) for slug in slugs}


def seed_label(source: str, seed: int | None) -> str:
    """`none`, or the seed's source (option, env, fixed, submission) and a hash of it."""
    if seed is None:
        return "none"
    return f"{source} {short_hash(f'theinference-seed:{seed}'.encode())[:12]}"


def test_seed_source(seed: int | None) -> str:
    """Where `theinference test` got its seed: THEINFERENCE_SEED, else --seed."""
    if seed is None:
        return "none"
    return "env" if os.environ.get(SEED_VAR, "").strip() == str(seed) else "option"


def provenance(
    slugs,
    settings_toml: bytes | None,
    weights_sha256: str,
    seed_source: str,
    seed: int | None,
) -> dict:
    """The fields a run knows before it starts (the sandbox and platform are added by
    `with_run`)."""
    return {
        "theinference": __version__,
        "specs": spec_hashes(slugs),
        "settings": "none" if settings_toml is None else short_hash(settings_toml),
        "weights": weights_sha256,
        "seed": seed_label(seed_source, seed),
    }


def with_run(fields: dict, sandbox: str) -> dict:
    return {**fields, "sandbox": sandbox, "platform": platform.platform()}


def flatten(fields: dict | None) -> dict[str, str]:
    """{"specs": {"build-prefill": h}} -> {"specs.build-prefill": h}, for comparing."""
    flat: dict[str, str] = {}
    for key, value in (fields or {}).items():
        if isinstance(value, dict):
            flat.update({f"{key}.{inner}": str(v) for inner, v in value.items()})
        else:
            flat[key] = str(value)
    return flat
