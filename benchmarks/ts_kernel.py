"""The TypeScript course's matrix products against NumPy's, in GFLOP/s on GPT-2's shapes.

Candidates for the product behind the provided src/gpt2.ts: the WebAssembly SIMD kernel the
course ships, fused (src/kernel-fma.wasm, relaxed SIMD, as the grader starts Node) and plain
(src/kernel.wasm, both from src/kernel.wat), on one thread and on every core; the plain
JavaScript product the course shipped before it; and, given its node_modules, TensorFlow.js's
WebAssembly backend (XNNPACK; `npm install @tensorflow/tfjs-core@4.22.0
@tensorflow/tfjs-backend-wasm@4.22.0` in a scratch folder). Each figure is the best of several
tries (wall time), next to NumPy's on the same shapes, on one thread and on every core.

    python benchmarks/ts_kernel.py [--tfjs DIR/node_modules]

Needs Node and the runner in tests/fixtures/ts_runner (`npm ci --prefix tests/fixtures/ts_runner`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from theinference.course.directory import init_course  # noqa: E402
from theinference.course.languages import TYPESCRIPT  # noqa: E402
from theinference.student.launch import kernel_flags  # noqa: E402

NODE_MODULES = Path(
    os.environ.get("THEINFERENCE_NODE_MODULES") or ROOT / "tests/fixtures/ts_runner/node_modules"
)
SHAPES = [  # (n, d, m, W transposed), as in ts_kernel.mts
    (1024, 768, 2304, False),
    (1024, 768, 3072, False),
    (1024, 3072, 768, False),
    (128, 768, 3072, False),
    (1, 768, 3072, False),
    (1, 3072, 768, False),
    (1, 768, 50257, True),
]
FLOPS_PER_TRY = 4e9


def numpy_rates() -> dict[str, float]:
    rng = np.random.default_rng(0)
    rates = {}
    for n, d, m, transposed in SHAPES:
        x = rng.random((n, d), dtype=np.float32) - 0.5
        w = rng.random((m, d) if transposed else (d, m), dtype=np.float32) - 0.5
        product = (lambda x=x, w=w: x @ w.T) if transposed else (lambda x=x, w=w: x @ w)
        product()
        best = float("inf")
        for _ in range(max(1, min(200, round(FLOPS_PER_TRY / (2 * n * d * m))))):
            start = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - start)
        rates[f"{n}x{d}x{m}{'T' if transposed else ''}"] = 2 * n * d * m / best / 1e9
    return rates


def numpy_rates_with(threads: int | None) -> dict[str, float] | None:
    """NumPy's rates with its BLAS limited to `threads` (None: as configured), or None when
    threadpoolctl (to set the limit) is missing."""
    if threads is None:
        return numpy_rates()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    with threadpool_limits(threads):
        return numpy_rates()


def node_rates(course: Path, candidate: str, threads: int | None, extra: str | None,
               kernel: str | None = None):
    """The candidate's rates per shape; `kernel`: the binary kernel.ts must report using."""
    env = {**os.environ}
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    script = ROOT / "benchmarks" / "ts_kernel.mts"
    argv = ["node", *kernel_flags(), "--import", "tsx", str(script), str(course)]
    done = subprocess.run(
        [*argv, candidate, *([extra] if extra else [])],
        cwd=course, env=env, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{candidate}: node failed\n{done.stderr}")
    if kernel and f"kernel: {kernel}" not in done.stderr:
        raise SystemExit(f"{course.name}: kernel.ts did not run the {kernel} kernel\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tfjs", help="a node_modules with @tensorflow/tfjs-backend-wasm")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        course, plain = Path(tmp) / "course", Path(tmp) / "plain"
        for where in (course, plain):
            init_course(where, TYPESCRIPT)
            (where / "node_modules").symlink_to(NODE_MODULES)
        (plain / "src" / "kernel-fma.wasm").unlink()  # kernel.ts then runs kernel.wasm
        columns = {
            f"numpy, {cores} threads": numpy_rates_with(None),
            "numpy, 1 thread": numpy_rates_with(1),
            f"fused kernel, {cores} thr": node_rates(course, "wasm", None, None, "fma"),
            "fused kernel, 1 thread": node_rates(course, "wasm", 1, None, "fma"),
            f"plain SIMD, {cores} threads": node_rates(plain, "wasm", None, None, "simd"),
            "plain SIMD, 1 thread": node_rates(plain, "wasm", 1, None, "simd"),
            "plain JavaScript": node_rates(course, "js", 1, None),
        }
        if args.tfjs:
            columns["tfjs wasm (XNNPACK)"] = node_rates(course, "tfjs", 1, args.tfjs)
    columns = {k: v for k, v in columns.items() if v is not None}
    print_table(columns)


def print_table(columns: dict[str, dict[str, float]]) -> None:
    shapes = list(next(iter(columns.values())))
    width = max(len(s) for s in shapes) + 2
    print("GFLOP/s, best of several tries (n x d x m: [n, d] @ [d, m]; T: @ [m, d]^T)")
    print("shape".ljust(width) + "".join(f"{name:>24}" for name in columns))
    for shape in shapes:
        cells = "".join(f"{rates[shape]:>24.1f}" for rates in columns.values())
        print(shape.ljust(width) + cells)


if __name__ == "__main__":
    main()
