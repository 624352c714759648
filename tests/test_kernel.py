"""The TypeScript course's matrix kernel (templates/ts/src/kernel.wat, kernel.wasm,
kernel-fma.wasm and kernel.ts): the shipped binaries are their source assembled, both (plain
SIMD, and fused multiply-adds where Node runs relaxed SIMD) give products that agree with NumPy's
to float32 noise on every path they take (one row or many, W as stored or transposed, one array
or rows, edges that are not multiples of its blocks), the thread count changes no bit of any
result, and a fused binary that does not multiply right is never used.

These need Node, the runner (`npm ci --prefix tests/fixtures/ts_runner`) and, for the build
check, wabt (`npm ci --prefix tools/kernel`); .ci/run installs both.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.test_typescript import NODE_MODULES, REFERENCE_TS, node_major, ts_course
from theinference.course.languages import TYPESCRIPT
from theinference.student.launch import FUSED_KERNEL, kernel_flags

ROOT = Path(__file__).parents[1]
WABT = ROOT / "tools" / "kernel" / "node_modules" / "wabt" / "package.json"

# (n, d, m, transposed, W given as rows, with a bias): each path and edge of the kernel
CASES = [
    (1, 768, 3072, False, False, True),  # one row: W streamed
    (1, 3072, 768, False, False, True),
    (1, 64, 50, True, False, False),  # one row, W transposed (the unembedding's path)
    (1, 6, 5, False, False, False),  # one row, d not a multiple of 4: padded with zero rows
    (1, 8, 3, False, False, False),  # one row, fewer columns than a vector
    (2, 7, 3, False, False, True),  # fewer rows than a tile
    (5, 300, 17, False, True, True),  # a tile of 4 and one row; W as rows
    (9, 513, 1030, False, False, True),  # past a 256-row block and a 512-column one
    (33, 64, 33, True, True, False),  # attention scores: rows @ rows^T
    (64, 64, 64, False, True, False),  # attention's weighted sum: rows @ rows
]

SCRIPT = """
import { readFileSync, writeFileSync } from "node:fs";
import { KERNEL, product } from "./src/kernel.ts";

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
console.log(KERNEL);
process.exit(0);
"""


def kernel_flags_ts() -> tuple[str, ...]:
    """Node's flags for the TypeScript template's fused kernel, as the worker gets them."""
    return kernel_flags(TYPESCRIPT.template / FUSED_KERNEL)


@pytest.fixture(scope="module")
def kernel_course(tmp_path_factory):
    return ts_course(tmp_path_factory.mktemp("kernel") / "c")


@pytest.fixture(scope="module", params=["fma", "simd"])
def each_kernel(request, tmp_path_factory):
    """(course, the kernel it must run): the course as provided, run as the grader runs it
    (fused where this Node has relaxed SIMD), and one without kernel-fma.wasm (plain SIMD)."""
    course = ts_course(tmp_path_factory.mktemp("kernel") / request.param)
    if request.param == "simd":
        (course / "src" / "kernel-fma.wasm").unlink()
        return course, "simd"
    return course, "fma" if relaxed_simd_node() else "simd"


def relaxed_simd_node() -> bool:
    """Whether this Node runs relaxed SIMD as the grader starts it: every Node from 20 does."""
    return node_major() >= 20


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


def products(course: Path, data: np.ndarray, threads: int, kernel: str) -> np.ndarray:
    """Every case's product through the course's kernel.ts, started as the grader starts the
    student's process (its Node flags); fails unless `kernel` is the binary that multiplied."""
    (course / "check.ts").write_text(SCRIPT)
    (course / "cases.json").write_text(json.dumps(CASES))
    (course / "inputs.bin").write_bytes(data.astype(np.float32).tobytes())
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(["node", *kernel_flags_ts(), "--import", "tsx", "check.ts"], cwd=course,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == kernel, done.stdout
    return np.frombuffer((course / "outputs.bin").read_bytes(), dtype=np.float32)


def test_products_match_numpy_on_every_path(each_kernel):
    """Catches a wrong tile, block edge, row or column remainder, transposed or rows path, in
    either binary: each would put some output far from NumPy's product (here within float32
    summation noise: a few units of the last place of the sum of |terms|); and the fused
    kernel not used where Node can run it (the grader's flag missing), or used without its
    file."""
    course, kernel = each_kernel
    data, wanted, magnitudes = inputs(np.random.default_rng(7))
    got = products(course, data, threads=2, kernel=kernel)
    at = 0
    for case, want, magnitude in zip(CASES, wanted, magnitudes, strict=True):
        mine = got[at : at + want.size].reshape(want.shape)
        at += want.size
        # a term lost or counted twice moves a value by about 1, far past this
        assert (np.abs(mine - want) <= 8 * np.finfo(np.float32).eps * magnitude).all(), case
    assert at == got.size


def test_thread_count_changes_no_bit(kernel_course):
    """Catches threads that share a product's columns wrongly (a chunk done twice, skipped, or
    summed in another order), or helpers that run another binary than the calling thread: the
    result must not depend on how many threads there are. The sharing is the same code for
    either binary; this checks the one the grader runs."""
    kernel = "fma" if relaxed_simd_node() else "simd"
    data, _, _ = inputs(np.random.default_rng(11))
    one = products(kernel_course, data, 1, kernel)
    for threads in (2, 5):
        assert np.array_equal(one, products(kernel_course, data, threads, kernel)), threads


NOT_MULTIPLYING = """(module
  (import "env" "memory" (memory 1 65536 shared))
  (func (export "packx") (param i32 i32 i32 i32 i32))
  (func (export "gemm") (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) BODY))
"""


@pytest.mark.parametrize("broken", ["garbage", "wrong", "trapping"])
def test_a_fused_kernel_that_fails_its_check_is_not_used(tmp_path, broken):
    """Catches kernel-fma.wasm used on trust: one that Node cannot validate, a valid one that
    does not multiply (as a prototype Node's other encoding of relaxed SIMD could), or one that
    traps, must leave the plain kernel multiplying, right, and not crash the course."""
    course = ts_course(tmp_path / "c")
    fused = course / "src" / "kernel-fma.wasm"
    if broken == "garbage":
        fused.write_bytes(b"\0asm\1\0\0\0 not a module")
    else:
        assert WABT.is_file(), "no wabt: run `npm ci --prefix tools/kernel` (.ci/run does)"
        body = "unreachable" if broken == "trapping" else "nop"
        (tmp_path / "wrong.wat").write_text(NOT_MULTIPLYING.replace("BODY", body))
        assemble = (
            'const w = await require("wabt")(); const f = {simd: true, threads: true};'
            'const m = w.parseWat("w", require("fs").readFileSync(process.argv[1], "utf8"), f);'
            'require("fs").writeFileSync(process.argv[2], m.toBinary({}).buffer);'
        )
        done = subprocess.run(["node", "--input-type=commonjs", "-e",
                               f"(async () => {{ {assemble} }})()", str(tmp_path / "wrong.wat"),
                               str(fused)], cwd=WABT.parents[2], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and fused.stat().st_size > 8, done.stderr
    data, wanted, magnitudes = inputs(np.random.default_rng(3))
    got = products(course, data, threads=2, kernel="simd")
    want = np.concatenate([w.ravel() for w in wanted])
    bound = 8 * np.finfo(np.float32).eps * np.concatenate([m.ravel() for m in magnitudes])
    assert (np.abs(got - want) <= bound).all()


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


READ_WEIGHTS = """
import { openSync, fstatSync, readFileSync } from "node:fs";
import { readWeights } from "./src/kernel.ts";

for (const file of process.argv.slice(2)) {
  const fd = openSync(file, "r");
  const bytes = readWeights(fd, fstatSync(fd).size, 8 + (file.length % 64));
  const same = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).equals(readFileSync(file));
  console.log(same ? "same" : "differs");
}
process.exit(0);
"""


@pytest.mark.parametrize("threads", [1, 5])
def test_the_weights_file_is_read_whole_by_every_thread_count(kernel_course, tmp_path, threads):
    """Catches readWeights (the checkpoint read by every kernel thread at once) putting a block
    of the file in the wrong place, skipping one, reading past the end, or leaving the tail of a
    file that is not a whole number of blocks: the kernel's bytes must equal the file's."""
    rng = np.random.default_rng(threads)
    sizes = [0, 3, (1 << 20) - 1, (1 << 20) + 7, 9 * (1 << 20) + 12345]
    files = []
    for size in sizes:
        files.append(tmp_path / f"w{size}.bin")
        files[-1].write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    (kernel_course / "read.ts").write_text(READ_WEIGHTS)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(["node", "--import", "tsx", "read.ts", *map(str, files)],
                          cwd=kernel_course, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["same"] * len(sizes), done.stdout


AFTER_NAN = """
import { writeFileSync } from "node:fs";
import { softmax } from "./src/gpt2.ts";
import { product } from "./src/kernel.ts";

softmax(new Float32Array(1), 1 << 20); // leaves NaN across the kernel's scratch memory (4 MB)
const x = Float32Array.from([1, 2, 3, 4, 5, 6]);
const W = Float32Array.from({ length: 30 }, (_, i) => i - 10); // [6, 5]
writeFileSync("after_nan.bin", product([x], W, 6, 5)[0]);
process.exit(0);
"""


def test_a_one_row_product_pads_with_zeros_not_leftovers(kernel_course):
    """Catches the padding of a one-row product whose d is not a multiple of 4 (attention's
    weighted sum over any number of rows) left as whatever the scratch memory held: NaN left
    there by an earlier call would then turn the whole result into NaN."""
    (kernel_course / "after_nan.ts").write_text(AFTER_NAN)
    done = subprocess.run(["node", *kernel_flags_ts(), "--import", "tsx", "after_nan.ts"],
                          cwd=kernel_course, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.frombuffer((kernel_course / "after_nan.bin").read_bytes(), dtype=np.float32)
    want = np.arange(1, 7) @ (np.arange(30) - 10).reshape(6, 5)
    assert np.array_equal(got, want.astype(np.float32)), got


SHORT_READ = """
import { openSync } from "node:fs";
import { product, readWeights } from "./src/kernel.ts";

// a product big enough for every thread: whole numbers, so exact
const X = Array.from({ length: 64 }, (_, i) =>
  Float32Array.from({ length: 256 }, (_, k) => (i + k) % 5));
const W = Float32Array.from({ length: 256 * 512 }, (_, j) => (j % 7) - 3);
const fd = openSync(process.argv[2], "r");
const tries = [];
for (let t = 0; t < 8; t++) { // the threads race: several tries, helpers asleep or awake
  let refused = "no";
  try {
    readWeights(fd, 400 << 20, 0); // 400 MB claimed of a 9 MB file
  } catch (err) {
    refused = String(err.message);
  }
  const out = product(X, W, 256, 512); // right after it
  tries.push({ refused, sums: out.map((row) => row.reduce((a, b) => a + b, 0)) });
}
console.log(JSON.stringify(tries));
process.exit(0);
"""


def test_a_failed_read_leaves_the_threads_ready_for_the_next_product(kernel_course, tmp_path):
    """Catches readWeights on a file shorter than its size passing silently, and a failed job
    that leaves the kernel's threads mid-job or its failure flag set: the next product then
    throws "a kernel thread failed", or returns before its chunks are done (wrong sums)."""
    short = tmp_path / "short.bin"
    short.write_bytes(bytes(9 << 20))
    (kernel_course / "short.ts").write_text(SHORT_READ)
    env = {**os.environ, "OMP_NUM_THREADS": "5"}
    done = subprocess.run(["node", *kernel_flags_ts(), "--import", "tsx", "short.ts", str(short)],
                          cwd=kernel_course, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    x = (np.arange(64)[:, None] + np.arange(256)[None, :]) % 5
    w = (np.arange(256 * 512).reshape(256, 512) % 7) - 3
    for got in json.loads(done.stdout.splitlines()[-1]):
        assert "ended before its size" in got["refused"] or "could not read" in got["refused"]
        assert got["sums"] == (x @ w).sum(axis=1).tolist()
