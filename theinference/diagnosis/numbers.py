"""What a stage's numbers show when no catalogued bug gives them: which cases depart, where
along the map's axes (every layer, one layer, from a step on), and how far. Said instead of a
list of classic bugs, some of which could not apply to the case (a bug about the cache on a
one-token case): only what was measured."""

from theinference.results import CaseResult, Status, where_text

FAR = 10.0  # worse than this many tolerances is far past it, not a rounding difference


def numbers_shown(cases: list[CaseResult]) -> str:
    """The failing numbers described, or "" when no case failed on its numbers."""
    failing = [c for c in cases if c.status == Status.FAILED and c.worst is not None]
    if not failing:
        return ""
    shown = failing[0]
    parts = [which_cases(cases, failing)]
    if shown.error_map:
        parts.append(f"in '{shown.name}', {map_pattern(shown.error_map)}")
    elif shown.where:
        parts.append(f"in '{shown.name}', it first departs at {where_text(shown.where)}")
    parts.append(how_far(failing))
    return "What the numbers show: " + "; ".join(parts) + "."


def which_cases(cases: list[CaseResult], failing: list[CaseResult]) -> str:
    passing = [c.name for c in cases if c.status == Status.PASSED]
    if not passing:
        return f"every case departs, '{failing[0].name}' too"
    names = "; ".join(f"'{c.name}'" for c in failing)
    return f"{len(failing)} of {len(cases)} cases depart ({names}); the others match"


def how_far(failing: list[CaseResult]) -> str:
    worst = max(failing, key=lambda c: c.worst)
    size = "far past the tolerance" if worst.worst > FAR else "just past the tolerance"
    comparison = max(worst.comparisons, key=lambda c: c.worst)
    return (
        f"{size}: at worst {worst.worst:.3g}x it ('{worst.name}'), a largest difference of "
        f"{comparison.max_abs:.3g} over {comparison.mismatched_percent:.3g}% of its values"
    )


def map_pattern(error_map: dict) -> str:
    """How the departure lies along the map's rows (layers, steps) and columns."""
    cells = error_map["cells"]
    rows = departing(error_map["rows"], [max(line) for line in cells])
    columns = departing(error_map["columns"], [max(col) for col in zip(*cells, strict=True)])
    first = where_text(error_map["first_at"])
    return f"{rows}, {columns}; it first departs at {first}"


def departing(axis: dict, worst: list[float]) -> str:
    """"every layer departs", "layer 3 alone departs", "from step 2 on (step 0–1 match)",
    "layer 0–10 depart, 11 match", over the (perhaps merged) labels of one axis."""
    name, labels = axis["name"], axis["labels"]
    bad = [i for i, x in enumerate(worst) if x > 1]
    if len(labels) == 1:
        return f"at {name} {labels[0]}"
    if len(bad) == len(labels):
        return f"every {name} departs"
    if len(bad) == 1:
        return f"{name} {labels[bad[0]]} alone departs"
    if bad == list(range(bad[0], len(labels))):
        return f"from {name} {labels[bad[0]]} on ({name} {span(labels, 0, bad[0])} match)"
    if bad == list(range(bad[-1] + 1)):
        return f"{name} {span(labels, 0, bad[-1] + 1)} depart, {span(labels, bad[-1] + 1)} match"
    return f"{name} {', '.join(labels[i] for i in bad)} depart, the rest match"


def span(labels: list[str], start: int, stop: int | None = None) -> str:
    """The labels from start to stop as one run: "3", or "0–10"."""
    chosen = labels[start:stop]
    first, last = chosen[0].split("–")[0], chosen[-1].split("–")[-1]
    return first if first == last else f"{first}–{last}"
