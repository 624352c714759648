"""Which students handed in the same code: their own files (src/kvcache and tests/adapters,
Python or TypeScript, as the records keep them) compared pairwise with copydetect, a
maintained implementation of winnowing (the fingerprinting behind MOSS), with the provided
template subtracted: every fingerprint that occurs in the course template of that language
is boilerplate and never counts. Identifiers and strings are normalised away before
fingerprinting, so renamed variables still match.

A pair's similarity is the larger of the two shares: how much of one student's own
(non-template) code also stands in the other's. It never changes a score; the class report
lists the pairs at or above the threshold with the shared fragments side by side, escaped
(student text is untrusted).
"""

import io
import itertools
from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePosixPath

from theinference.course.directory import template_files
from theinference.course.languages import Language, by_suffix
from theinference.results.submission import Record
from theinference.results.text import terminal_text

THRESHOLD = 0.5  # measured: independent solutions share 0.14-0.34, a renamed copy 1.0
MIN_SHARED = 200  # normalised characters: below this a pair shares idioms, not a solution
NOISE = 25  # copydetect's noise threshold: the shortest match that counts, in characters
WINDOW = 4  # winnowing window: every match of NOISE + WINDOW - 1 characters is seen
MARK = ("<mark>", "</mark>")


class SimilarityUnavailable(Exception):
    """copydetect is not installed: the message says how to add it."""


@dataclass
class Fragment:
    path: str  # the file, as the course keeps it
    left: str  # HTML: the first student's file, shared code in <mark>, everything escaped
    right: str


@dataclass
class Pair:
    a: str
    b: str
    share_a: float  # of a's own code, the part b has too
    share_b: float
    shared: int  # normalised characters in common
    fragments: list[Fragment] = field(default_factory=list)

    @property
    def similarity(self) -> float:
        return max(self.share_a, self.share_b)


def detector():
    try:
        import copydetect
    except ImportError:
        raise SimilarityUnavailable(
            "the similarity check needs copydetect: pip install 'theinference[similarity]'"
        ) from None
    return copydetect


def similar_pairs(records: list[Record], threshold: float = THRESHOLD) -> list[Pair]:
    """Every pair of students whose own code is at least `threshold` alike, most alike
    first."""
    prints = {r.id: fingerprints(r.code) for r in records}
    pairs = []
    for a, b in itertools.combinations(sorted(prints), 2):
        pair = compare(a, prints[a], b, prints[b])
        if pair is not None and pair.similarity >= threshold and pair.shared >= MIN_SHARED:
            pairs.append(pair)
    return sorted(pairs, key=lambda p: (-p.similarity, p.a, p.b))


def fingerprints(code: dict[str, str]) -> dict:
    """path -> copydetect's fingerprint of that file, the template's fingerprints removed."""
    copydetect = detector()
    out = {}
    for path, text in sorted(code.items()):
        language = by_suffix(PurePosixPath(path).suffix)
        if language is None:
            continue
        # controls made visible first: the fragments shown are cut from this very text
        out[path] = copydetect.CodeFingerprint(path, NOISE, WINDOW, boilerplate=boilerplate(
            language), fp=io.StringIO(terminal_text(text)))
    return out


@cache
def boilerplate(language: Language):
    """Every fingerprint of the provided template in this language: never a student's own."""
    import numpy as np

    copydetect = detector()
    root = language.template
    hashes: set = set()
    for rel in template_files(root):
        if by_suffix(rel.suffix) is language:
            text = (root / rel).read_text()
            hashes |= copydetect.CodeFingerprint(
                rel.as_posix(), NOISE, 1, fp=io.StringIO(text)).hashes
    return np.array(sorted(hashes))


def compare(a: str, left: dict, b: str, right: dict) -> Pair | None:
    """The pair's shares over the files both have (kvcache with kvcache, adapters with
    adapters); None when they have no own code in common."""
    copydetect = detector()
    from copydetect.utils import highlight_overlap

    shared_a = shared_b = 0
    fragments = []
    for path in sorted(left.keys() & right.keys()):
        x, y = left[path], right[path]
        overlap, (sim_x, sim_y), (slices_x, slices_y) = copydetect.compare_files(x, y)
        if not overlap:
            continue
        shared_a += sim_x * x.token_coverage
        shared_b += sim_y * y.token_coverage
        fragments.append(Fragment(
            path,
            highlight_overlap(x.raw_code, slices_x, *MARK, escape_html=True)[0],
            highlight_overlap(y.raw_code, slices_y, *MARK, escape_html=True)[0],
        ))
    own_a = sum(f.token_coverage for f in left.values())
    own_b = sum(f.token_coverage for f in right.values())
    if not fragments or not own_a or not own_b:
        return None
    return Pair(a, b, float(shared_a / own_a), float(shared_b / own_b),
                int(max(shared_a, shared_b)), fragments)
