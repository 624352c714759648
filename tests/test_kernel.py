"""The TypeScript course's matrix kernel (templates/ts/src/kernel.wat, .wasm and kernel.ts):
the shipped binary is its source assembled, its products agree with NumPy's to float32 noise on
every path it takes (one row or many, W as stored or transposed, one array or rows, edges that
are not multiples of its blocks), and the thread count changes no bit of any result.

These need Node, the runner (`npm ci --prefix tests/fixtures/ts_runner`) and, for the build
check, wabt (`npm ci --prefix tools/kernel`); .ci/run installs both.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.test_typescript import NODE_MODULES, REFERENCE_TS, ts_course

ROOT = Path(__file__).parents[1]
WABT = ROOT / "tools" / "kernel" / "node_modules" / "wabt" / "package.json"

# (n, d, m, transposed, W given as rows, with a bias): each path and edge of the kernel
CASES = [
    (1, 768, 3072, False, False, True),  # one row: W streamed
    (1, 3072, 768, False, False, True),
    (1, 64, 50, True, False, False),  # one row, W transposed (the unembedding's path)
    (1, 6, 5, False, False, False),  # one row, d not a multiple of 4: the packed path
    (1, 8, 3, False, False, False),  # one row, fewer columns than a vector
    (2, 7, 3, False, False, True),  # fewer rows than a tile
    (5, 300, 17, False, True, True),  # a tile of 4 and one row; W as rows
    (9, 513, 1030, False, False, True),  # past a 256-row block and a 512-column one
    (33, 64, 33, True, True, False),  # attention scores: rows @ rows^T
    (64, 64, 64, False, True, False),  # attention's weighted sum: rows @ rows
]

SCRIPT = """
import { readFileSync, writeFileSync } from "node:fs";
import { product } from "./src/kernel.ts";

const cases = JSON.parse(readFileSync("cases.json", "utf8"));
const raw = readFileSync("inputs.bin");
const data = new Float32Array(raw.byteLength / 4);
new Uint8Array(data.buffer).set(raw);
const out = [];
let at = 0;
const take = (n) => data.subarray(at, (at += n));
for (const [n, d, m, transposed, asRows, withBias] of cases) {
  const X = Array.from({ length: n }, () => take(d));
  const flat = take(d * m);
  const width = transposed ? d : m;
  const W = asRows ? Array.from({ length: flat.length / width }, (_, i) =>
    flat.subarray(i * width, (i + 1) * width)) : flat;
  const b = withBias ? take(m) : undefined;
  for (const row of product(X, W, d, m, b, transposed)) out.push(...row);
}
writeFileSync("outputs.bin", new Float32Array(out));
process.exit(0);
"""


@pytest.fixture(scope="module")
def kernel_course(tmp_path_factory):
    return ts_course(tmp_path_factory.mktemp("kernel") / "c")


def inputs(rng):
    """Each case's X, W and bias (float32) in one array; NumPy's float64 product of each, and
    the sum of its terms' magnitudes (float32 summation noise is a few eps of that)."""
    arrays, wanted, magnitudes = [], [], []
    for n, d, m, transposed, _, with_bias in CASES:
        x = rng.standard_normal((n, d), dtype=np.float32)
        w = rng.standard_normal((m, d) if transposed else (d, m), dtype=np.float32)
        b = rng.standard_normal(m, dtype=np.float32) if with_bias else np.zeros(m, np.float32)
        arrays += [x.ravel(), w.ravel()] + ([b] if with_bias else [])
        w64 = w.astype(np.float64).T if transposed else w.astype(np.float64)
        wanted.append(x.astype(np.float64) @ w64 + b)
        magnitudes.append(np.abs(x.astype(np.float64)) @ np.abs(w64) + np.abs(b))
    return np.concatenate(arrays), wanted, magnitudes


def products(course: Path, data: np.ndarray, threads: int) -> np.ndarray:
    (course / "check.ts").write_text(SCRIPT)
    (course / "cases.json").write_text(json.dumps(CASES))
    (course / "inputs.bin").write_bytes(data.astype(np.float32).tobytes())
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(["node", "--import", "tsx", "check.ts"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.frombuffer((course / "outputs.bin").read_bytes(), dtype=np.float32)


def test_products_match_numpy_on_every_path(kernel_course):
    """Catches a wrong tile, block edge, row or column remainder, transposed or rows path:
    each would put some output far from NumPy's product (here within float32 summation
    noise: a few units of the last place of the sum of |terms|)."""
    data, wanted, magnitudes = inputs(np.random.default_rng(7))
    got = products(kernel_course, data, threads=2)
    at = 0
    for case, want, magnitude in zip(CASES, wanted, magnitudes, strict=True):
        mine = got[at : at + want.size].reshape(want.shape)
        at += want.size
        # a term lost or counted twice moves a value by about 1, far past this
        assert (np.abs(mine - want) <= 8 * np.finfo(np.float32).eps * magnitude).all(), case
    assert at == got.size


def test_thread_count_changes_no_bit(kernel_course):
    """Catches threads that share a product's columns wrongly (a chunk done twice, skipped, or
    summed in another order): the result must not depend on how many threads there are."""
    data, _, _ = inputs(np.random.default_rng(11))
    one = products(kernel_course, data, threads=1)
    for threads in (2, 5):
        assert np.array_equal(one, products(kernel_course, data, threads)), threads


def test_shipped_wasm_is_the_wat_assembled():
    """Catches a kernel.wasm edited or rebuilt from something other than the kernel.wat that
    ships beside it (the binary must be reproducible from its committed source)."""
    assert WABT.is_file(), "no wabt: run `npm ci --prefix tools/kernel` (.ci/run does)"
    done = subprocess.run(["node", str(ROOT / "tools" / "kernel" / "build.mjs"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout


def test_the_course_type_checks_with_its_pinned_compiler(tmp_path):
    """Catches a template whose own files (or a full solution) fail `npx tsc --noEmit`: a
    missing @types/node, a type error in gpt2.ts or kernel.ts, tsconfig not covering tests/."""
    tsc = NODE_MODULES / "typescript" / "bin" / "tsc"
    assert tsc.is_file(), f"no typescript in {NODE_MODULES}: run `npm ci` in its folder"
    for name, kvcache in (("stubs", None), ("reference", REFERENCE_TS)):
        course = ts_course(tmp_path / name, kvcache)
        done = subprocess.run(["node", str(tsc), "--noEmit", "-p", str(course)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (name, done.stdout[-3000:])


ELEMENTWISE = """
import { readFileSync, writeFileSync } from "node:fs";
import { softmax } from "./src/gpt2.ts";
import { geluInPlace } from "./src/kernel.ts";

const { rows, gelu } = JSON.parse(readFileSync("elementwise.json", "utf8"), (_, v) =>
  v === "-inf" ? -Infinity : v === "inf" ? Infinity : v === "nan" ? NaN : v);
const out = [];
for (const [values, length, asArray] of rows) {
  const s = asArray ? [...values] : Float32Array.from(values);
  softmax(s, length);
  out.push(...s);
}
const g = [Float32Array.from(gelu)];
geluInPlace(g);
out.push(...g[0]);
writeFileSync("elementwise.bin", new Float32Array(out));
process.exit(0);
"""


def test_softmax_and_gelu_match_numpy(kernel_course):
    """Catches a wrong e^x (range reduction, polynomial, exponent bits), a padded lane that
    counts, a softmax that writes past `length` or drops a plain array's values, one given a
    length past its values that answers from stale memory (or throws) instead of NaN, and a
    GELU off its tanh form: each puts some value far past float32 noise from NumPy's answer."""
    rng = np.random.default_rng(5)
    rows = [
        (rng.standard_normal(n) * scale, length, as_array)
        for n, length, scale, as_array in [
            (1, 1, 1, False), (3, 3, 4, False), (4, 4, 1, False), (5, 5, 30, False),
            (1024, 1024, 8, False), (10, 7, 2, False), (6, 6, 1, True), (9, 0, 1, False),
            (3, 5, 1, False), (3, 5, 1, True),  # a length past the values: NaN, as in plain JS
        ]
    ]
    masked = rng.standard_normal(8)
    masked[5:] = -np.inf  # a causal mask written as -infinity
    rows.append((masked, 8, False))
    rows.append((np.array([-200.0, 0.0, -90.0]), 3, False))  # e^x under float32's range
    gelu = np.concatenate([np.linspace(-12, 12, 997), [0.0, -0.0, 1e-30, -100.0, 100.0, 5e3]])
    spec = {"rows": [[[float(v) if np.isfinite(v) else "-inf" for v in x.astype(np.float32)],
                      length, as_array] for x, length, as_array in rows],
            "gelu": [float(v) for v in gelu.astype(np.float32)]}
    (kernel_course / "elementwise.json").write_text(json.dumps(spec))
    (kernel_course / "elementwise.ts").write_text(ELEMENTWISE)
    done = subprocess.run(["node", "--import", "tsx", "elementwise.ts"], cwd=kernel_course,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.frombuffer((kernel_course / "elementwise.bin").read_bytes(), dtype=np.float32)
    at = 0
    for x, length, _ in rows:
        x32 = x.astype(np.float32).astype(np.float64)
        mine, at = got[at : at + x.size], at + x.size
        want = x32.copy()
        if length > x.size:
            assert np.isnan(mine).all(), (x.size, length)
            continue
        if length:
            e = np.exp(x32[:length] - x32[:length].max())
            want[:length] = e / e.sum()
        assert np.allclose(mine, want, rtol=4e-6, atol=1e-9), (x.size, length)
        assert (mine[length:] == x.astype(np.float32)[length:]).all()  # past length: untouched
    g64 = gelu.astype(np.float32).astype(np.float64)
    want = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3)))
    mine = got[at:]
    assert mine.size == gelu.size
    assert np.allclose(mine, want, rtol=4e-6, atol=1e-9)
