"""Reading float arrays as rows of K/V, the same in the student's process (part of the worker:
imports nothing of the grader), which writes the rows the grader names, and in the grader,
which searches them (student/row_index.py): every array is read along each axis whose
length is a multiple of 64 as rows of 64 consecutive values.
"""


def row_views(a, hd: int, lead: int = 0) -> list:
    """Views [..., hd] of the array, each with its kind and axis: along every axis whose length is a
    multiple of hd (axes of exactly hd first: "exact"), that axis moved last and split into
    runs of hd consecutive values ("runs": a merged [N, 768] row is 12 heads of 64; a fused K|V
    row 24), then into hd values a stride apart ("minor": a row kept head-minor, [64, 12]).
    The first `lead` axes are never read as rows and stay first (arrays stacked on them are
    read as each would be alone). Views only: writing one writes the array."""
    return list(each_row_view(a, hd, lead))


def each_row_view(a, hd: int, lead: int = 0):
    """row_views one at a time (the swap's writes want one)."""
    import numpy as np

    if a.ndim <= lead or a.size < hd * int(np.prod(a.shape[:lead])):
        return
    exact_first = sorted(range(lead, a.ndim), key=lambda axis: a.shape[axis] != hd)
    for axis in exact_first:
        length = a.shape[axis]
        if length % hd:
            continue
        moved = np.moveaxis(a, axis, -1)
        if length == hd:
            yield moved, "exact", axis
            continue
        # splitting one axis in two is always a view, whatever its stride
        yield moved.reshape(*moved.shape[:-1], length // hd, hd), "runs", axis
        minor = moved.reshape(*moved.shape[:-1], hd, length // hd)
        yield np.swapaxes(minor, -1, -2), "minor", axis
