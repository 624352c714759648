"""Cache use proven in every cached stage, by evidence the student's code can neither see nor
set: a swapped cache (the answer must be the one over K/V no token sequence has) and a bound
from arithmetic (a fresh process stopped at a fraction of a recompute's floor). Forgers fail
with a message that says so; correct solutions in any layout pass; "cannot tell" never
passes."""

import os
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import SOLUTIONS, installed, make_course, reference_text, swap_in_process
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.checks.common import Verdict, Words
from theinference.curriculum.checks.floor import floor_verdict, forward_flop, with_cost
from theinference.curriculum.checks.swap import SwapPlan
from theinference.curriculum.stages import drawn_per_run, load_stages, with_run_draws
from theinference.grading.answer_cache import ORACLE_VERSION, read_or_make_secret
from theinference.oracle.config import ModelConfig
from theinference.oracle.gpt2 import LayerKV
from theinference.results import Status
from theinference.student import calibration, sandbox
from theinference.student.channel import Probe
from theinference.student.process import StudentProcess
from theinference.student.setup import Limits, ProcessSetup

CHEATS = tomllib.loads((SOLUTIONS / "recompute_cheats.toml").read_text())["cheats"]


def proof_case(stage):
    """The case that proves the stage's cache is used, if it has one: drawn per run, over a
    swapped cache or against a floor."""
    return next((c for c in stage.cases if is_proof(c)), None)


def is_proof(case) -> bool:
    """A case drawn per run whose check is a proof alone: a swap's, or a floor's that always
    measures (a graded case measured against its floor is no proof case, though its floor
    meets inputs drawn per run too)."""
    return drawn_per_run(case) and proves(CHECKS[case.check])


def proves(check) -> bool:
    return (check.swap is not None and check.flop is None) or (
        check.flop is not None and check.cached_flop is None)


PROOFS = {s.slug: case for s in load_stages() if (case := proof_case(s)) is not None}
# a floor's proof swaps too (generate-loop's), but its floor stays its fallback: a floor's
SWAPPED = [slug for slug, case in PROOFS.items()
           if CHECKS[case.check].swap is not None and CHECKS[case.check].flop is None]
FLOORED = [slug for slug, case in PROOFS.items() if CHECKS[case.check].flop is not None]
# the swap cases' draws, made small so the fast tests stay fast (the specs draw as the cases do)
SMALL_DRAWS = {
    "decode_cache_use": {"prompt": {"random": [9, 9]}, "next_id": {"token": "any"}},
    "decode_sequence_swap": {"prompt": {"random": [7, 7]}, "continuation": {"random": [3, 3]}},
    "step_attention_swap": {"seq": {"random": [8, 8]}},
}
GPT2 = ModelConfig(n_layer=12, n_embd=768, vocab_size=50257, n_ctx=1024)


# the floors' cases made small the same way: a quarter of the prompt, a quarter of the new
# tokens or prompts. A recompute of them still needs over 5x a cache's work and far more than
# MEASURED_FLOP, so the floor tells them apart as at full size (the full-size proofs grade
# correct caches in tests/test_cache_layouts.py), and a forger is stopped at its budget in a
# few seconds of CPU, far inside the stage's own timeout however busy the machine
SMALL_FLOORS = {
    "generate_cost": {
        "prompt": {"random": 240, "seed": 77}, "floor_draw": {"prompt": {"random": [240, 240]}},
        "max_new_tokens": 16,
    },
    "prefix_caching_cost": {
        "prompt": {"random": 255, "seed": 78}, "floor_draw": {"prompt": {"random": [255, 255]}},
        "start": 240, "step": 1, "count": 16,
    },
}


def proof_stage(slug: str, small: bool = False):
    (stage,) = [s for s in load_stages() if s.slug == slug]
    case = PROOFS[slug]
    if small and case.check in SMALL_DRAWS:
        swap = {"swap": {"between": [0, 2**31 - 1]}}
        case = replace(case, inputs={"draw": SMALL_DRAWS[case.check] | swap})
    if small and case.check in SMALL_FLOORS:
        case = replace(case, inputs=SMALL_FLOORS[case.check])
    return replace(stage, cases=(case,), timeout=900)


def grade_proof(
    course: Path, weights, slug: str, small: bool = False, answers=None, seed=None
):
    (case,) = grade_proofs(course, weights, [slug], small, answers=answers, seed=seed)
    return case


def grade_proofs(
    course: Path, weights, slugs: list, small: bool = False, sandbox=None, answers=None,
    seed=None,
) -> list:
    """Each stage's proof case, graded in one run (one student process for them all), with
    the session's answers and seed where given (the `answers` and `run_seed` fixtures)."""
    from theinference.grading.grader import RunPlan, grade

    stages = [proof_stage(slug, small) for slug in slugs]
    limits = Limits(timeout=900)
    setup = ProcessSetup(course, weights.path, limits, sandbox=sandbox)
    run = grade(setup, RunPlan(stages, weights, answers, seed=seed))
    return [case for stage in run.stages for case in stage.cases]


def test_every_cached_stage_has_a_proof_no_recompute_can_give():
    """Catches a cached stage (or single-step attention) that compares outputs only, where a
    recompute would pass, and a stage without its forgers. A stage is cached when its checks
    wrap a function of the student's cache (a hook) or count a recompute's work (a floor)."""
    cached = {c.stage for c in CHECKS.values() if c.hook is not None or c.flop is not None}
    assert cached == set(PROOFS), cached ^ set(PROOFS)
    assert len(PROOFS) >= 5 and not set(SWAPPED) & set(FLOORED), (SWAPPED, FLOORED)
    for slug in SWAPPED:  # every call of the stage looks alike until the hooked function returns
        (stage,) = [s for s in load_stages() if s.slug == slug]
        assert {CHECKS[c.check].hook for c in stage.cases} == {CHECKS[stage.cases[-1].check].hook}
    assert {c["stage"] for c in CHEATS} == set(SWAPPED + FLOORED)
    assert all(sum(c["stage"] == s for c in CHEATS) >= 2 for s in SWAPPED + FLOORED)


def test_proof_arguments_are_drawn_per_run_and_from_the_seed():
    """Catches a probe whose arguments a submission could know (fixed in the spec: its swap,
    or the prompt a floor meets, where its swap is tried over a fixed prompt) or that a given
    --seed does not reproduce."""
    for slug in SWAPPED + FLOORED:
        stage = proof_stage(slug)
        drawn = [with_run_draws(stage, seed).cases[0].inputs for seed in (1, 2, 1)]
        assert drawn[0] == drawn[2] and drawn[0]["swap"] != drawn[1]["swap"], slug
        assert "draw" not in drawn[0] and "floor_draw" not in drawn[0]
        if "prompt" in stage.cases[0].inputs.get("floor_draw", {}):  # a floor over a fresh one
            assert drawn[0]["floor"]["prompt"] != drawn[1]["floor"]["prompt"], slug
    assert any("floor" in with_run_draws(proof_stage(s), 1).cases[0].inputs for s in FLOORED)


# --- locating K/V by content, in layouts the grader was not written against ------------------

H, N, HD = 12, 5, 64


def kv(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((H, N, HD)).astype(np.float32)


def layouts(k: np.ndarray, v: np.ndarray) -> dict:
    """The same K/V kept in many ways; each value a (holder, read back as [h, n, hd]). The
    PyTorch ones (TORCH_LAYOUTS) only where torch is installed."""
    stacked = np.zeros((1, 2, H, 16, HD))  # [layers, K|V, h, capacity, hd], float64
    stacked[0, 0, :, :N], stacked[0, 1, :, :N] = k, v
    rows = [[k[:, p].reshape(-1).copy() for p in range(N)], [v[:, p].copy() for p in range(N)]]
    return {
        "[h, n, hd]": ({"k": k.copy(), "v": v.copy()}, lambda c: (c["k"], c["v"])),
        "keys transposed, [n, h, hd] values": (
            [k.transpose(0, 2, 1).copy(), v.transpose(1, 0, 2).copy()],
            lambda c: (c[0].transpose(0, 2, 1), c[1].transpose(1, 0, 2)),
        ),
        "merged [n, d]": (
            tuple(a.transpose(1, 0, 2).reshape(N, -1).copy() for a in (k, v)),
            lambda c: tuple(a.reshape(N, H, HD).transpose(1, 0, 2) for a in c),
        ),
        "one array per head": (
            {"k": [k[i].copy() for i in range(H)], "v": [v[i].copy() for i in range(H)]},
            lambda c: (np.stack(c["k"]), np.stack(c["v"])),
        ),
        "preallocated stack": (stacked, lambda c: (c[0, 0, :, :N], c[0, 1, :, :N])),
        "a list of rows": (
            rows,
            lambda c: (np.stack(c[0]).reshape(N, H, HD).transpose(1, 0, 2), np.stack(c[1], 1)),
        ),
        **more_layouts(k, v),
        **holder_layouts(k, v),
        **(torch_layouts(k, v) if installed("torch") else {}),
    }


def merged(a: np.ndarray) -> np.ndarray:
    return a.transpose(1, 0, 2).reshape(N, H * HD)  # [h, n, hd] -> [n, d]


def unmerged(a: np.ndarray) -> np.ndarray:
    return a.reshape(N, H, HD).transpose(1, 0, 2)  # [n, d] -> [h, n, hd]


class Node:
    __slots__ = ("k", "v", "next")

    def __init__(self, k, v, nxt):
        self.k, self.v, self.next = k, v, nxt


def more_layouts(k: np.ndarray, v: np.ndarray) -> dict:
    """Layouts strong students write, each a correct cache of the same K/V."""
    import collections

    fused = np.concatenate([merged(k), merged(v)], axis=1)  # [n, 2d]
    pool = np.zeros((2, 4, H, 16, HD), dtype=np.float32)  # K|V pools of 4 blocks of 16
    table = [2, 0]  # this layer's block table: positions 0..15 in block 2
    pool[0, table[0], :, :N], pool[1, table[0], :, :N] = k, v
    readonly = [k.copy(), v.copy()]
    for a in readonly:
        a.flags.writeable = False
    head = None
    for p in reversed(range(N)):  # a linked list of per-position nodes
        head = Node(k[:, p].copy(), v[:, p].copy(), head)
    arena = np.zeros((2 * 16, H * HD), dtype=np.float32)  # [(K|V) x capacity, d]
    arena[:N], arena[16 : 16 + N] = merged(k), merged(v)
    per_token = [np.stack([merged(k)[p], merged(v)[p]]) for p in range(N)]  # [2, d] each
    interleaved = np.concatenate([k, v], axis=2)  # [h, n, 2 hd]
    kept = {"k": k.copy(), "v": v.copy()}

    def closure():
        return kept  # the cache lives in a closure's cell

    def walk(node):
        out = []
        while node is not None:
            out.append(node)
            node = node.next
        return np.stack([x.k for x in out], 1), np.stack([x.v for x in out], 1)

    return {
        "fused K|V [n, 2d]": (
            fused,
            lambda c: (unmerged(c[:, : H * HD]), unmerged(c[:, H * HD :])),
        ),
        "paged pool and block table": (
            {"pool": pool, "table": table},
            lambda c: (c["pool"][0, 2, :, :N], c["pool"][1, 2, :, :N]),
        ),
        "read-only arrays": (readonly, lambda c: (c[0], c[1])),
        "linked nodes (slots)": (head, walk),
        "keys pre-scaled by 1/8": ([k / 8, v.copy()], lambda c: (c[0] * 8, c[1])),
        "arena [(K|V) x capacity, d]": (
            arena,
            lambda c: (unmerged(c[:N]), unmerged(c[16 : 16 + N])),
        ),
        "one [2, d] array per token, in a deque": (
            collections.deque(per_token),
            lambda c: (
                unmerged(np.stack([t[0] for t in c])),
                unmerged(np.stack([t[1] for t in c])),
            ),
        ),
        "heads with K|V interleaved [h, n, 2 hd]": (
            interleaved,
            lambda c: (c[:, :, :HD], c[:, :, HD:]),
        ),
        "float16 arrays": ([k.astype(np.float16), v.astype(np.float16)], lambda c: c),
        "a closure's cell": (closure, lambda c: (c()["k"], c()["v"])),
    }


SHUFFLE = np.random.default_rng(64).permutation(HD)  # one order of a row's values


def holder_layouts(k: np.ndarray, v: np.ndarray) -> dict:
    """The same K/V held by memory other than float arrays, or where a walk rarely looks."""
    import ctypes
    import functools
    import io
    import mmap

    as_f32 = lambda raw: np.frombuffer(raw, dtype=np.float32).reshape(H, N, HD)  # noqa: E731
    structured = np.zeros((H, N), dtype=[("k", "<f4", (HD,)), ("v", "<f4", (HD,))])
    structured["k"], structured["v"] = k, v
    objects = np.empty((2, H, N), dtype=object)  # one row array per cell
    for i, p in np.ndindex(H, N):
        objects[0, i, p], objects[1, i, p] = k[i, p].copy(), v[i, p].copy()
    anonymous = mmap.mmap(-1, 2 * k.nbytes)
    anonymous[:] = k.tobytes() + v.tobytes()

    def keeper(kept_k, kept_v):
        while True:  # the K/V live in the suspended generator's frame
            yield kept_k, kept_v

    generator = keeper(k.copy(), v.copy())
    next(generator)
    c_floats = ctypes.c_float * k.size
    head_minor = lambda a: a.transpose(1, 2, 0).reshape(N, HD * H).copy()  # noqa: E731
    return {
        "a complex64 array, K real and V imaginary": (
            (k + 1j * v).astype(np.complex64), lambda c: (c.real, c.imag)),
        "int32 bit patterns": (
            [k.view(np.int32).copy(), v.view(np.int32).copy()],
            lambda c: (c[0].view(np.float32), c[1].view(np.float32))),
        "a structured dtype": (structured, lambda c: (c["k"], c["v"])),
        "bytearray and BytesIO": (
            {"k": bytearray(k.tobytes()), "v": io.BytesIO(v.tobytes())},
            lambda c: (as_f32(c["k"]), as_f32(c["v"].getvalue()))),
        "ctypes float arrays": (
            [c_floats.from_buffer_copy(k.tobytes()), c_floats.from_buffer_copy(v.tobytes())],
            lambda c: (as_f32(bytes(c[0])), as_f32(bytes(c[1])))),
        "a memoryview of an anonymous mmap (shared memory's buffer)": (
            memoryview(anonymous),
            lambda c: (as_f32(c[: k.nbytes].tobytes()), as_f32(c[k.nbytes :].tobytes()))),
        "lists of Python floats": (
            {"k": [merged(k)[p].tolist() for p in range(N)],
             "v": [merged(v)[p].tolist() for p in range(N)]},
            lambda c: (unmerged(np.array(c["k"], np.float32)),
                       unmerged(np.array(c["v"], np.float32)))),
        "an object array of rows": (
            objects, lambda c: tuple(np.array(c[j].tolist(), np.float32) for j in (0, 1))),
        "a suspended generator's frame": (generator, lambda c: next(c)),
        "a partial's arguments": (
            functools.partial(np.add, k.copy(), v.copy()), lambda c: (c.args[0], c.args[1])),
        "each row's 64 values in a fixed order of their own": (
            [k[..., SHUFFLE].copy(), v[..., SHUFFLE].copy()],
            lambda c: tuple(a[..., np.argsort(SHUFFLE)] for a in c)),
        "each position's heads kept head-minor [n, hd * h]": (
            [head_minor(k), head_minor(v)],
            lambda c: tuple(a.reshape(N, HD, H).transpose(2, 0, 1) for a in c)),
    }


def torch_layouts(k: np.ndarray, v: np.ndarray) -> dict:
    """The layouts of a cache kept in PyTorch."""
    import torch

    as_torch = [torch.from_numpy(k.copy())[None], torch.from_numpy(v.copy())[None]]
    module = torch.nn.Module()  # a module is callable: its buffers are searched too
    module.register_buffer("cache_k", torch.from_numpy(k.copy())[None], persistent=False)
    module.register_buffer("cache_v", torch.from_numpy(v.copy())[None], persistent=False)
    bf16 = [torch.from_numpy(a.copy()).to(torch.bfloat16) for a in (k, v)]
    return {
        "torch [1, h, n, hd]": (as_torch, lambda c: (c[0][0].numpy(), c[1][0].numpy())),
        "a PyTorch module's buffers": (
            module,
            lambda c: (c.cache_k[0].numpy(), c.cache_v[0].numpy()),
        ),
        "bfloat16 tensors": (bf16, lambda c: tuple(t.float().numpy() for t in c)),
    }


# every layout by name, so that collection needs no torch (the PyTorch ones skip without it)
TORCH_LAYOUTS = ["torch [1, h, n, hd]", "a PyTorch module's buffers", "bfloat16 tensors"]
LAYOUTS = [
    "[h, n, hd]", "keys transposed, [n, h, hd] values", "merged [n, d]", "one array per head",
    "preallocated stack", "a list of rows", "fused K|V [n, 2d]", "paged pool and block table",
    "read-only arrays", "linked nodes (slots)", "keys pre-scaled by 1/8",
    "arena [(K|V) x capacity, d]", "one [2, d] array per token, in a deque",
    "heads with K|V interleaved [h, n, 2 hd]", "float16 arrays", "a closure's cell",
    "a complex64 array, K real and V imaginary", "int32 bit patterns", "a structured dtype",
    "bytearray and BytesIO", "ctypes float arrays",
    "a memoryview of an anonymous mmap (shared memory's buffer)", "lists of Python floats",
    "an object array of rows", "a suspended generator's frame", "a partial's arguments",
    "each position's heads kept head-minor [n, hd * h]",
    "each row's 64 values in a fixed order of their own",
    *TORCH_LAYOUTS,
]


def test_every_layout_is_named_for_the_swap_test():
    """Catches a layout added to layouts() that the swap test below never runs (or a name
    there that no layout has)."""
    built = list(layouts(kv(0), kv(1)))
    expected = LAYOUTS if installed("torch") else [n for n in LAYOUTS if n not in TORCH_LAYOUTS]
    assert sorted(built) == sorted(expected) and len(set(LAYOUTS)) == len(LAYOUTS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_swap_finds_and_overwrites_kv_in_any_layout(layout):
    """Catches a swap that knows only the reference's layout (a correct cache would fail), that
    copies instead of writing in place, or that touches the weights."""
    if layout in TORCH_LAYOUTS and not installed("torch"):
        pytest.skip("torch is not installed (.ci/run installs it)")
    k, v = kv(0), kv(1)
    holder, read = layouts(k, v)[layout]
    weights = {"wte.weight": np.ones((4, HD), dtype=np.float32), "copy": k.copy()}
    new_k, new_v = kv(2), kv(3)
    done = swap_in_process([holder], weights, [LayerKV(k, v)], [LayerKV(new_k, new_v)])
    assert done["applied"], done
    got_k, got_v = read(holder)
    rtol = 1e-2 if "float16" in layout else 1e-6  # each stored in its own dtype
    np.testing.assert_allclose(got_k, new_k, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(got_v, new_v, rtol=rtol, atol=rtol)
    assert np.array_equal(weights["copy"], k)  # the weights are never searched nor written


def test_an_object_the_walk_cannot_read_does_not_hide_the_cache():
    """Catches a walk that ends at the first object it cannot read (a closed BytesIO raises
    when its buffer is asked for): the correct cache beside it would never be swapped."""
    import io

    k, v = kv(0), kv(1)
    closed = io.BytesIO(bytes(4 * HD))
    closed.close()
    holder = {"odd": closed, "k": k.copy(), "v": v.copy()}
    done = swap_in_process([holder], None, [LayerKV(k, v)], [LayerKV(kv(2), kv(3))])
    assert done["applied"], done
    np.testing.assert_array_equal(holder["k"], kv(2))


def test_a_cache_missing_one_layer_is_not_swapped_and_says_which():
    """Catches a partial swap (some K/V kept elsewhere would make the answer meaningless) or a
    silent one: nothing is written, and the reason names the layer."""
    k, v, k1, v1 = kv(0), kv(1), kv(4), kv(5)
    # layer 1's V absent, an unrelated array of its size in its place
    holder = {"layers": [{"k": k.copy(), "v": v.copy()}, {"k": k1.copy(), "x": kv(11)}]}
    finds, writes = [LayerKV(k, v), LayerKV(k1, v1)], [LayerKV(kv(6), kv(7)), LayerKV(kv(8), kv(9))]
    done = swap_in_process([holder], None, finds, writes)
    assert not done["applied"] and "layer 1's V" in done["reason"]
    assert "0 of 60 of its rows" in done["reason"], done["reason"]  # what was found, said
    assert "4 float arrays reachable" in done["reason"], done["reason"]
    assert np.array_equal(holder["layers"][0]["k"], k)
    del holder["layers"][1]["x"]  # fewer values than the K/V hold: said cheaply
    done = swap_in_process([holder], None, finds, writes)
    assert not done["applied"] and "fewer than" in done["reason"], done["reason"]


HOOKED_COURSE = {
    "adapters": """
        import numpy as np
        from src.kvcache import prefill as build_cache   # found by its own name
        class MC:
            def __init__(self): self.store = {}
        def run(ids):
            mc = MC()
            build_cache(ids, {"w": np.zeros(3)}, mc)
            return float(mc.store["k"].sum())
        """,
    "kvcache": """
        import numpy as np
        def prefill(ids, w, mc):
            mc.store["k"] = np.arange(12 * len(ids) * 64, dtype=np.float32).reshape(12, -1, 64)
            mc.store["v"] = -mc.store["k"]
        """,
}


def test_the_hooked_function_is_swapped_after_it_returns_under_any_alias(tmp_path):
    """Catches a hook that only wraps `prefill` when the adapter uses that very name, a swap
    sent before the function returned, or a graded call (no swap) that is altered."""
    course = course_with(tmp_path, HOOKED_COURSE["adapters"], HOOKED_COURSE["kvcache"])
    k = np.arange(12 * 2 * 64, dtype=np.float32).reshape(12, 2, 64)
    words = []
    plan = SwapPlan("prefill", 1, [LayerKV(k, -k)], [LayerKV(np.ones_like(k), np.ones_like(k))],
                    None, None)

    def swap(word):
        words.append(word)
        return plan.answer(word)

    with StudentProcess(ProcessSetup(course, Path("/nonexistent.safetensors"), Limits())) as w:
        plain = w.call("run", [[1, 2]], 60, Probe("prefill"))
        swapped = w.call("run", [[1, 2]], 60, Probe("prefill", answer=swap))
    assert plain.kind == swapped.kind == "returned", (plain.message, swapped.message)
    assert float(plain.value) == float(k.sum()) and float(swapped.value) == k.size
    assert [sorted(w) for w in words] == [["call"], ["about", "held"]], words  # one word, then
    assert swapped.probe["swap"]["applied"] and plan.sent, swapped.probe  # what it held


SILENT = """
def run(ids):
    import time
    time.sleep(30)   # never reads another request, never answers
    return [1.0]
"""


def test_a_process_that_stops_reading_cannot_block_the_grader(tmp_path):
    """Catches a grader that writes a large request (or a hook's answer) to a pipe nobody reads
    and blocks forever: the call times out instead."""
    course = course_with(tmp_path, SILENT)
    with StudentProcess(ProcessSetup(course, Path("/nonexistent.safetensors"), Limits())) as w:
        first = w.call("run", [[1]], 2)
        second = w.call("run", [list(range(200_000))], 2)  # far more than a pipe holds
    assert first.kind == second.kind == "timeout"


# --- the bound from arithmetic ------------------------------------------------------------------


def say_for(slug: str) -> Words:
    return Words("theinference.curriculum.checks." + slug.replace("-", "_"))


def test_the_floor_counts_a_recomputes_least_work():
    """Catches a floor that counts too much (a correct cache would fail) or nothing."""
    one_row = forward_flop(GPT2, 1)
    assert one_row == 2 * (11 * 12 + 2) * 768**2
    generate = CHECKS["generate_cost"].flop([[1] * 512, 64], GPT2)
    assert generate == sum(forward_flop(GPT2, 512 + s) for s in range(64))


def test_a_call_stopped_at_its_budget_fails_and_says_what_was_measured():
    """Catches a recompute passing, or a failure that does not give the figures."""
    measured = {"cpu_seconds": 9.1, "floor": 30.0, "limit": 7.5, "stopped": True}
    verdict = floor_verdict(measured, say_for("generate-loop"), {"steps": 64, "prompt": 512})
    assert verdict.status == Status.FAILED and verdict.suspected_bug == "decode-recomputes"
    assert "9.10 s of CPU" in verdict.message and "30.00 s" in verdict.message


def test_a_call_well_under_the_floor_is_the_cost_of_a_cache():
    """Catches a correct cache failed for the cost its own prefill already has, a cost that
    passes a wrong answer, or a verdict that does not say what was measured."""
    measured = {"cpu_seconds": 1.5, "floor": 30.0, "limit": 7.5, "stopped": False}
    figures = {"prompts": 32, "total": 574}
    said = floor_verdict(measured, say_for("prefix-caching"), figures)
    right = with_cost(said, lambda: Verdict(Status.PASSED, message="logits match"))
    assert right.status == Status.PASSED, right.message
    assert right.message.startswith("logits match (") and "20x under" in right.message
    wrong = with_cost(said, lambda: Verdict(Status.FAILED, message="logits depart"))
    assert wrong.status == Status.FAILED and "logits depart" in wrong.message
    over = floor_verdict({**measured, "cpu_seconds": 9.0}, say_for("prefix-caching"), figures)
    judged = with_cost(over, lambda: Verdict(Status.PASSED, message="logits match"))
    assert judged.status == Status.FAILED and "9.00 s of CPU" in judged.message, judged.message


@pytest.mark.parametrize("measured", [None, {}, {"error": "the calibration failed: crashed"}])
def test_nothing_measured_is_never_a_pass(measured):
    """Catches "not applicable" counted as a pass."""
    verdict = floor_verdict(measured, say_for("prefix-caching"), {"prompts": 2, "total": 9})
    assert verdict.status == Status.FAILED and "does not pass" in verdict.message


def test_the_rate_is_measured_without_loading_the_students_code(tmp_path):
    """Catches a calibration the student's code could run in (and so slow down, to raise the
    floor), or one that measures nothing."""
    marker = tmp_path / "imported"
    course = course_with(tmp_path, f"open({str(marker)!r}, 'w').close()\n" + SPIN_AND_NAP)
    with StudentProcess(ProcessSetup(
            course, Path("/nonexistent.safetensors"), Limits())) as process:
        rate, why = calibration.measure(process)
    assert rate is not None and rate > 1e8, why
    assert not marker.exists()


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_a_module_laid_beside_the_course_never_runs_in_the_calibration(tmp_path, mode):
    """Catches a calibration that imports from the course directory: a numpy.py at the
    course's root (a loose file in a class submission lands there) would run in it and could
    slow the rate ten times, raising the floor until a recompute passes under it."""
    course = course_with(tmp_path, SPIN_AND_NAP)
    (course / "numpy.py").write_text("raise SystemExit('the course shadowed numpy')\n")
    with StudentProcess(ProcessSetup(
        course, Path("/nonexistent.safetensors"), Limits(), sandbox=sandbox.choose(mode)
    )) as process:
        rate, why = calibration.measure(process)
    assert rate is not None and rate > 1e8, why


SPIN_AND_NAP = """
import time
def spin(n):
    end = time.thread_time() + n
    while time.thread_time() < end:
        sum(range(20000))  # arithmetic: user time, as a recompute's
    return [1.0]
def nap(n):
    time.sleep(n)
    return [1.0]
"""


def course_with(tmp_path: Path, adapters: str, kvcache: str = "") -> Path:
    for folder in ("tests", "src"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "src" / "kvcache.py").write_text(textwrap.dedent(kvcache))
    (tmp_path / "tests" / "adapters.py").write_text(textwrap.dedent(adapters))
    return tmp_path


# --- end to end: forgers fail, correct layouts pass -------------------------------------------


def cheat_params():
    # those whose work hides in children: tests/test_cpu_account.py, under every account
    return [
        pytest.param(c, id=c["id"], marks=() if c["stage"] in SWAPPED else pytest.mark.slow)
        for c in CHEATS
        if not c["id"].endswith("-forked-unseen")
    ]


@pytest.mark.parametrize("cheat", cheat_params())
def test_a_forger_fails_its_stage_saying_it_recomputes(
    cheat, tmp_path, weights, answers, run_seed
):
    """Catches a submission that gets the right numbers without using its cache, however it
    was written against the grader's proofs."""
    course = make_course(tmp_path / "c", reference_text() + cheat["code"])
    if cheat.get("scope") == "stage":  # graded on its stage's cases (a swap's: the short ones)
        quick = cheat["stage"] in SWAPPED
        # a floor's stage at a timeout long enough for any recompute: the floor, not the
        # clock, must stop it (stopped inside the stage's own timeout: test_cpu_account.py);
        # there only the cases a floor judges, where a recompute can be seen (the others'
        # right answers, recomputed, pass whatever the floor: a minute of the suite's time)
        timeout = None if quick else 3600
        cases = grade_stage(course, weights, cheat["stage"], 7, quick, timeout, answers,
                            floors_only=not quick)
        assert any(c.status == Status.FAILED for c in cases), cases
        assert all(c.status in (Status.PASSED, Status.FAILED) for c in cases), cases
        messages = [c.message for c in cases if c.status == Status.FAILED]
        assert all("recompute" in m for m in messages), messages
        return
    case = grade_proof(course, weights, cheat["stage"], True, answers, run_seed)
    assert case.status == Status.FAILED, case
    said = ("recompute", "could not swap", "the call started a process")
    assert any(words in case.message for words in said), case.message


def grade_stage(
    course: Path, weights, slug: str, seed: int, quick: bool, timeout, answers=None,
    floors_only: bool = False
) -> list:
    """A stage's graded cases (not its proofs), as a quick run grades them (the long ones
    left out) or every one, at the stage's own timeout (None) or another; `floors_only`: only
    those a floor judges (alone, in a fresh process)."""
    from tests.test_grading import measured
    from theinference.grading.grader import RunPlan, grade
    from theinference.grading.policy import RunPolicy

    (stage,) = [s for s in load_stages() if s.slug == slug]
    stage = replace(stage, timeout=timeout or stage.timeout)
    kept = [c for c in stage.cases if not is_proof(c)]
    if floors_only:
        drawn = {c.name: c for c in with_run_draws(stage, seed).cases}
        kept = [c for c in kept if measured(drawn[c.name])]
        assert kept, f"no case of {slug} is judged by a floor"
    stage = replace(stage, cases=tuple(kept))
    policy = RunPolicy(quick=quick)
    limits = Limits(timeout=stage.timeout)
    run = grade(ProcessSetup(course, weights.path, limits),
                RunPlan([stage], weights, answers, policy=policy, seed=seed))
    return [case for s in run.stages for case in s.cases if case.status != Status.SKIPPED]


def test_a_prefill_by_any_name_is_swapped_after_it_returns(
    tmp_path, weights, answers, run_seed
):
    """Catches a swap that waits for a function named `prefill`: a correct cache whose
    prefill has another name (or an adapter around a library's model) must pass, the moment
    after its prefill found by the return that left every K/V in memory."""
    course = make_course(tmp_path / "c", reference_text().replace("prefill", "fill_cache"))
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text().replace("prefill", "fill_cache"))
    slugs = ["full-decode-step", "per-step-identity"]
    cases = grade_proofs(course, weights, slugs, small=True, answers=answers, seed=run_seed)
    assert len(cases) == len(slugs)
    for case in cases:
        assert case.status == Status.PASSED, case.message


# the reference's prefill by another name, each layer's attention reading the K/V back from
# the cache once written, each layer given the whole cache (as the preallocated solution's:
# its every K/V is then in memory at the return of the last layer's write)
READ_BACK = {
    "q @ k.transpose(0, 2, 1)": "q @ cache.k.transpose(0, 2, 1)",
    "softmax(scores) @ v)": "softmax(scores) @ cache.v)",
    "def prefill_layer(X, w, layer, cache):": "def prefill_layer(X, w, layer, mc):\n"
                                              "    cache = mc.layers[layer]",
    "prefill_layer(X, w, layer, mc.layers[layer])": "prefill_layer(X, w, layer, mc)",
    "prefill": "fill_cache",
}


def test_a_prefill_that_reads_its_cache_back_is_judged_after_it_over_the_swap(
    tmp_path, weights, answers, run_seed, monkeypatch
):
    """Catches a correct cache failed because its swap landed inside its prefill: a prefill by
    another name that reads each layer's K/V back from the cache once written has every K/V
    in memory before its last layer's attention, where the swap is made and read (the last
    layer among those swapped here); its own output (the first token, the first prompt's
    logits) is then its own, and every later one must be the answer over the swapped cache."""
    from theinference.curriculum.checks import generate_loop, prefix_caching, swap
    from theinference.curriculum.checks.swap import FOLLOWED

    def last_layer_too(kv: list, seed: int) -> list:
        out, order = swap.shuffled_cache(kv, seed), np.random.default_rng(seed).permutation
        n = kv[0].k.shape[1]
        out[-1] = LayerKV(k=kv[0].k[:, order(n)], v=kv[1].v[:, order(n)])
        return out

    for module in (generate_loop, prefix_caching):
        monkeypatch.setattr(module, "shuffled_cache", last_layer_too)

    text = reference_text()
    for before, after in READ_BACK.items():
        assert before in text, before
        text = text.replace(before, after)
    course = make_course(tmp_path / "c", text)
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text().replace("prefill", "fill_cache"))
    cases = grade_proofs(course, weights, FLOORED, small=True, answers=answers, seed=run_seed)
    assert len(cases) == len(FLOORED)
    for case in cases:
        assert case.status == Status.PASSED, case.message
        assert case.message.startswith(FOLLOWED.split(":")[0]), case.message


DEEP_PREFILL = """
_filled = fill_cache


def decode_sequence(prompt_ids, continuation_ids, w, mc):
    return _outer(prompt_ids, continuation_ids, w, mc)


def _outer(prompt_ids, continuation_ids, w, mc):
    return _inner(prompt_ids, continuation_ids, w, mc)


def _inner(prompt_ids, continuation_ids, w, mc):
    _filled(prompt_ids, w, mc)  # three calls below the adapter, under another name
    rows = []
    for step, token_id in enumerate(continuation_ids):
        rows.append(decode_step(token_id, len(prompt_ids) + step, w, mc))
    return np.stack(rows)
"""


def test_a_prefill_under_another_name_three_calls_down_is_swapped_after_it_returns(
    tmp_path, weights, answers, run_seed
):
    """Catches a watch that looks for the moment after the prefill only in returns into the
    adapter or a function it called: a correct cache whose prefill, under another name, is
    reached three calls below the adapter was swapped only after its decode, and failed as a
    recompute."""
    text = reference_text().replace("prefill", "fill_cache") + DEEP_PREFILL
    course = make_course(tmp_path / "c", text)
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text().replace("prefill", "fill_cache"))
    cases = grade_proofs(course, weights, ["per-step-identity"], small=True, answers=answers,
                         seed=run_seed)
    assert len(cases) == 1 and cases[0].status == Status.PASSED, cases[0].message


HALF_RECOMPUTED = """
_cached_decode_step = decode_step
_filled_prefill = prefill


def prefill(prompt_ids, w, mc):
    mc.prompt = list(prompt_ids)
    return _filled_prefill(prompt_ids, w, mc)


def decode_step(token_id, position, w, mc):
    # half the cache's answer, half a recompute's: right over its own cache only
    cached = _cached_decode_step(token_id, position, w, mc)
    return 0.5 * cached + 0.5 * recompute_logits(mc.prompt + [token_id], w)[-1]
"""


def test_an_answer_that_departs_over_the_swapped_cache_fails_and_says_so(
    tmp_path, weights, answers, run_seed
):
    """Catches a decode that reads its cache for part of its answer and recomputes the rest
    (right over its own cache, wrong over the swapped one) passing, or failing with a message
    that blames a bug it does not have: it is asked again unswapped, found right there, and
    told that its answer departs over the swapped cache."""
    course = make_course(tmp_path / "c", reference_text() + HALF_RECOMPUTED)
    case = grade_proof(course, weights, "full-decode-step", True, answers, run_seed)
    assert case.status == Status.FAILED, case
    assert "though over the original it is right" in case.message, case.message


def test_answers_signed_by_the_student_as_the_graders_user_are_never_believed(
    tmp_path, monkeypatch
):
    """Catches attack 8: as the grader's own user (here root that cannot drop: the drop to a
    uid of its own made unavailable), a submission reads the answer secret, signs zeros as the
    answer to its own arguments and returns zeros. That run must fail (its answers stay in
    memory), and a later correct run on the same cache, sandboxed (bwrap or a uid of its own)
    so that it reads the disk cache, must pass: the forged file was signed with a secret
    replaced since."""
    from typer.testing import CliRunner

    from theinference.cli import app

    home = tmp_path / "home"
    cache = home / ".cache" / "theinference"
    cache.mkdir(parents=True)
    weights = Path(os.environ["THEINFERENCE_CACHE_DIR"]) / "synthetic-gpt2-124m-v1.safetensors"
    if weights.exists():
        os.link(weights, cache / weights.name)
    read_or_make_secret(cache / "answer-key")  # as an earlier, sandboxed run left it
    monkeypatch.delenv("THEINFERENCE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    forger = make_course(tmp_path / "forger", None)
    adapters = FORGING_ADAPTERS.replace("ORACLE_VERSION_HERE", str(ORACLE_VERSION))
    (forger / "tests" / "adapters.py").write_text(textwrap.dedent(adapters))
    with monkeypatch.context() as as_root:
        as_root.setattr(sandbox, "without_bwrap", lambda notes: sandbox.Sandbox("none", notes))
        forged = CliRunner().invoke(app, [*ONE_CASE, "-C", str(forger), "--sandbox", "none"])
    honest = make_course(tmp_path / "honest", reference_text())
    passed = CliRunner().invoke(app, [*ONE_CASE, "-C", str(honest)])  # bwrap, or a uid of its own
    assert forged.exit_code == 1, forged.output
    assert (home / "forged").exists(), forged.output  # it did sign its answer with the secret
    assert passed.exit_code == 0, passed.output


ONE_CASE = ["test", "--stage", "build-prefill", "--case", "one-token prompt"]
FORGING_ADAPTERS = """
    import hashlib, hmac, io, json, os
    from pathlib import Path
    import numpy as np

    def run_prefill(prompt_ids):
        root = Path(os.environ["HOME"]) / ".cache" / "theinference"
        secret = (root / "answer-key").read_bytes()
        sha = hashlib.sha256(Path(os.environ["THEINFERENCE_WEIGHTS"]).read_bytes()).hexdigest()
        text = json.dumps([ORACLE_VERSION_HERE, sha, "prefill_logits", [list(prompt_ids)]])
        key = hashlib.sha256(text.encode()).hexdigest()[:32]
        buffer = io.BytesIO()
        np.savez(buffer, array=np.zeros(50257, dtype=np.float32))
        payload = buffer.getvalue()
        mac = hmac.new(secret, key.encode() + b"\\0" + payload, hashlib.sha256).digest()
        folder = root / "answers" / sha[:16]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{key}.answer").write_bytes(mac + payload)
        (root.parent.parent / "forged").touch()
        return np.zeros(50257, dtype=np.float32)
"""
