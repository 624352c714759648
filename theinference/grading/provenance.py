"""What produced a grade: the grader's version, each stage spec and the course settings (by
hash), the weights, where the hidden cases' seed came from, the sandbox and the platform.

Two results that differ tell why by these fields (`gradebook diff`): a changed spec is a
changed tolerance or case list, a changed seed a new draw of hidden cases, a changed content
hash (the records' own) a resubmission. The seed itself is never written: only its source and
a short hash that tells two seeds apart (a hash of a small number is no secret from someone
who tries every number: the records stay the instructor's).
"""

import hashlib
import platform

from theinference import __version__
from theinference.curriculum.stages import SPEC_DIR
from theinference.grading.seed import Seed


def short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def spec_hashes(slugs) -> dict[str, str]:
    """Each graded stage's spec file, hashed: a tolerance, a case or a limit changed shows."""
    return {slug: short_hash((SPEC_DIR / f"{slug}.toml").read_bytes()) for slug in slugs}


def seed_label(seed: Seed) -> str:
    """`none`, or the seed's source (option, env, fixed, submission) and a hash of it."""
    if seed.value is None:
        return "none"
    return f"{seed.source} {short_hash(f'theinference-seed:{seed.value}'.encode())[:12]}"


def provenance(
    slugs,
    settings_toml: bytes | None,
    weights_sha256: str,
    seed: Seed,
) -> dict:
    """The fields a run knows before it starts (the sandbox and platform are added by
    `with_run`)."""
    return {
        "theinference": __version__,
        "specs": spec_hashes(slugs),
        "settings": "none" if settings_toml is None else short_hash(settings_toml),
        "weights": weights_sha256,
        "seed": seed_label(seed),
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
