"""A correct cache made slow on purpose, for the speed figure's ranking test and benchmark:
the reference solution, except that every layer of every decode step first copies the whole
model's cache. Never shipped to students."""

from tests.helpers import reference_text

SLOW_TAIL = '''

_fast_block_step = block_step


def block_step(x, w, layer, mc):
    # correct, and slow: the whole model's cache is copied at every layer of every step
    for each in mc.layers:
        each.k, each.v = each.k.copy(), each.v.copy()
    return _fast_block_step(x, w, layer, mc)
'''


def slow_cache_text() -> str:
    return reference_text() + SLOW_TAIL
