"""Check correct solutions outside the grader: each layout's src/kvcache.py (and, for the
transformers one, its tests/adapters.py) in a course made from the real template, its adapters
run in a child process against the synthetic weights, every answer compared with the oracle.

    python tests/solutions/check_layouts.py [--long] [layout ...]

A layout is a file stem in tests/solutions (fused_kvcache, ...); with none, every layout.
--long adds the stages' long inputs: a 960-token prompt with 64 decode steps and 64 generated
tokens, a decode at position 1023, attention over the whole context, and prefix caching from
a 960-token prompt. Prints, per adapter call, the maximum error (or the ids' agreement) and
the child's wall time."""

import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers import SOLUTIONS, make_course, with_template_stubs  # noqa: E402
from theinference.oracle import gpt2 as oracle  # noqa: E402
from theinference.oracle.weights import load_weights  # noqa: E402

LAYOUTS = {  # name -> (kvcache file, adapters file or None for the template's)
    "reference_kvcache": ("reference_kvcache.py", None),
    "fused_kvcache": ("fused_kvcache.py", None),
    "paged_kvcache": ("paged_kvcache.py", None),
    "readonly_kvcache": ("readonly_kvcache.py", None),
    "linked_kvcache": ("linked_kvcache.py", None),
    "prescaled_kvcache": ("prescaled_kvcache.py", None),
    "arena_kvcache": ("arena_kvcache.py", None),
    "per_token_kvcache": ("per_token_kvcache.py", None),
    "interleaved_kvcache": ("interleaved_kvcache.py", None),
    "torch_module_kvcache": ("torch_module_kvcache.py", None),
    "jax_kvcache": ("jax_kvcache.py", None),
    "held_everywhere_kvcache": ("held_everywhere_kvcache.py", None),
    "transformers_kvcache": ("transformers_kvcache.py", "transformers_adapters.py"),
}
LOGITS, ATTENTION = (1e-3, 1e-2), (1e-4, 1e-3)  # (atol, rtol), as the stages grade

CHILD = r"""
import pickle, sys, time, traceback
sys.path.insert(0, ".")
import numpy as np
from tests import adapters

def plain(x):
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if isinstance(x, (list, tuple)):
        return type(x)(plain(i) for i in x)
    return x

calls = pickle.load(open(sys.argv[1], "rb"))
out = []
for name, args in calls:
    start = time.perf_counter()
    try:
        value, error = plain(getattr(adapters, name)(*args)), None
    except Exception as e:
        value, error = None, (type(e).__name__, str(e), traceback.format_exc()[-800:])
    out.append((value, error, time.perf_counter() - start))
pickle.dump(out, open(sys.argv[2], "wb"))
"""


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 50257, n)]


def cases(long: bool) -> list[tuple[str, str, tuple]]:
    """(label, adapter, args)."""
    a, b = tokens(12, 1), tokens(9, 2)
    small = [
        ("step attention, 8 tokens", "run_step_attention", (tokens(8, 3),)),
        ("step attention, one token", "run_step_attention", ([464],)),
        ("step attention, ids 0/50256", "run_step_attention", ([0, 50256, 50256, 0, 0],)),
        ("prefill, 5 tokens", "run_prefill", (tokens(5, 4),)),
        ("prefill, one token", "run_prefill", ([0],)),
        ("prefill cache, 5 tokens", "run_prefill_cache", (tokens(5, 4),)),
        ("decode step, 9 + 1", "run_decode_step", (tokens(9, 5), 50256)),
        ("decode sequence, 7 + 3", "run_decode_sequence", (tokens(7, 6), tokens(3, 7))),
        ("generate, 5 + 8", "run_generate", (tokens(5, 8), 8)),
        ("generate refuses 1000 + 25", "run_generate", (tokens(1000, 9), 25)),
        ("generate refuses 1 + 1024", "run_generate", ([7], 1024)),
        (
            "prefix caching, 7 prompts",
            "run_prefix_caching",
            ([a, a + [5, 6, 7], a, a[:6], b, a[:8] + b[:3], [a[0]]],),
        ),
    ]
    if not long:
        return small
    p960 = tokens(960, 10)
    return small + [
        ("step attention, 1024 tokens", "run_step_attention", (tokens(1024, 11),)),
        ("prefill cache, 1024 tokens", "run_prefill_cache", (tokens(1024, 12),)),
        ("decode step at 1023", "run_decode_step", (tokens(1023, 13), 11)),
        ("decode sequence, 960 + 64", "run_decode_sequence", (p960, tokens(64, 14))),
        ("generate, 960 + 64", "run_generate", (p960, 64)),
        (
            "prefix caching, 960 then longer",
            "run_prefix_caching",
            ([p960, p960 + [1], p960 + [1, 2, 3], p960[:500] + [4]],),
        ),
    ]


class Oracle:
    def __init__(self, weights):
        self.w, self.layers = weights.tensors, weights.config.n_layer
        self.memo = {}

    def __call__(self, adapter: str, args: tuple):
        key = (adapter, repr(args))
        if key not in self.memo:
            self.memo[key] = self.answer(adapter, args)
        return self.memo[key]

    def last(self, ids):
        f = oracle.forward(ids, self.w, self.layers, last_only=True)
        return oracle.logits_at(f.hidden, self.w, [0])[0]

    def answer(self, adapter, args):
        w, layers = self.w, self.layers
        if adapter == "run_step_attention":
            return oracle.attn_sublayer(oracle.embed(args[0], w), w, 0)[0][-1]
        if adapter == "run_prefill":
            return self.last(args[0])
        if adapter == "run_prefill_cache":
            return [(kv.k, kv.v) for kv in oracle.forward(args[0], w, layers).kv]
        if adapter == "run_decode_step":
            return self.last(args[0] + [args[1]])
        if adapter == "run_decode_sequence":
            prompt, more = args
            f = oracle.forward(prompt + more, w, layers)
            return oracle.logits_at(f.hidden, w, list(range(len(prompt), len(prompt) + len(more))))
        if adapter == "run_generate":
            prompt, steps = args
            if len(prompt) + steps > 1024:
                return "ValueError"
            return oracle.greedy(oracle.forward(prompt, w, layers), steps, w, layers)
        if adapter == "run_prefix_caching":
            out, seen = [], []
            for p in args[0]:
                best = max([common(p, s) for s in seen] or [0])
                out.append((self.last(p), min(best, len(p) - 1)))
                seen.append(p)
            return out
        raise ValueError(adapter)


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def close(got, want, tol) -> tuple[bool, float]:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False, float("inf")
    err = float(np.abs(got - want).max()) if got.size else 0.0
    return bool(np.allclose(got, want, atol=tol[0], rtol=tol[1])), err


def judge(adapter, got, error, want, seconds) -> tuple[bool, str]:
    if isinstance(want, str):
        ok = error is not None and error[0] == "ValueError" and seconds < 1.0
        return ok, f"raised {error[0] if error else None} in {seconds:.3f} s"
    if error is not None:
        return False, f"{error[0]}: {error[1]}\n{error[2]}"
    if adapter == "run_step_attention":
        ok, err = close(got, want, ATTENTION)
        return ok, f"max |err| {err:.2e}"
    if adapter in ("run_prefill", "run_decode_step", "run_decode_sequence"):
        ok, err = close(got, want, LOGITS)
        return ok, f"max |err| {err:.2e}"
    if adapter == "run_prefill_cache":
        shapes = all(
            tuple(np.shape(g)) == w.shape for gp, wp in zip(got, want, strict=True)
            for g, w in zip(gp, wp, strict=True)
        ) and len(got) == len(want)
        err = max(close(g, w, LOGITS)[1] for gp, wp in zip(got, want, strict=False)
                  for g, w in zip(gp, wp, strict=False))
        said = f"shapes {'exact' if shapes else 'WRONG'}, max |err| {err:.2e}"
        return shapes and err < 1e-3, said
    if adapter == "run_generate":
        ids = [int(t) for t in got]
        same = sum(a == b for a, b in zip(ids, want, strict=False))
        return ids == want, f"{same}/{len(want)} ids equal"
    if adapter == "run_prefix_caching":
        reused = [int(r) for _, r in got]
        expect = [r for _, r in want]
        errs = [close(g, w, LOGITS) for (g, _), (w, _) in zip(got, want, strict=True)]
        ok = reused == expect and all(e[0] for e in errs)
        return ok, f"reused {reused} (want {expect}), max |err| {max(e[1] for e in errs):.2e}"
    raise ValueError(adapter)


def check(name: str, work: Path, weights, answers: Oracle, long: bool) -> bool:
    kvcache, adapters = LAYOUTS[name]
    text = (SOLUTIONS / kvcache).read_text()
    course = make_course(work / name, text if adapters else with_template_stubs(text))
    if adapters:
        (course / "tests" / "adapters.py").write_text((SOLUTIONS / adapters).read_text())
    todo = cases(long)
    calls, results = work / f"{name}.calls", work / f"{name}.results"
    calls.write_bytes(pickle.dumps([(adapter, args) for _, adapter, args in todo]))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "THEINFERENCE_WEIGHTS": str(weights.path),
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, calls, results], cwd=course, env=env, check=True)
    print(f"== {name} (child {time.perf_counter() - start:.1f} s)")
    passed = True
    for (label, adapter, args), (got, error, seconds) in zip(
        todo, pickle.loads(results.read_bytes()), strict=True
    ):
        ok, said = judge(adapter, got, error, answers(adapter, args), seconds)
        passed &= ok
        print(f"  {'ok  ' if ok else 'FAIL'} {label:34} {seconds:6.2f} s  {said}")
    return passed


def main(argv: list[str]) -> int:
    long = "--long" in argv
    names = [a for a in argv if not a.startswith("--")] or list(LAYOUTS)
    weights = load_weights("synthetic", Path("."))
    answers = Oracle(weights)
    with tempfile.TemporaryDirectory(prefix="check-layouts-") as tmp:
        failed = [n for n in names if not check(n, Path(tmp), weights, answers, long)]
    print("all passed" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
