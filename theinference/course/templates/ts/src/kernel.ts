// The fast matrix products behind gpt2.ts's matmul, matmulT and unembed. PROVIDED: you need not
// read it.
//
// kernel.wasm (assembled from kernel.wat) multiplies with WebAssembly SIMD, on every core: this
// thread and helper threads share each product's output columns, taking them in chunks from a
// shared counter, so a helper that is slow to wake never holds a product up. Every output value
// is summed in the same order whichever thread computes it, so results do not depend on the
// number of threads (OMP_NUM_THREADS sets it, as it does for NumPy's BLAS; else every core).
// Where Node runs relaxed SIMD, kernel-fma.wasm (the same, with fused multiply-adds) is used
// instead, after a check that it multiplies right. The weights are read straight into the
// kernel's memory (readWeights, by every thread) and used where they are; other arrays are
// copied in for each product.

import { readFileSync, readSync } from "node:fs";
import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";

interface Exports {
  packx(x: number, ldx: number, n: number, d: number, dst: number): void;
  gemm(...args: number[]): void;
  gemv(x: number, w: number, ldw: number, out: number, d: number, j0: number, j1: number): void;
  gemvt(x: number, w: number, ldw: number, out: number, d: number, j0: number, j1: number): void;
  softmax(at: number, n: number): void;
  gelu(at: number, n: number): void;
}

const PAGE = 65536;
const KC = 256; // rows of W per packed block
const NC = 512; // columns of W per packed block: KC x NC floats stay in a core's cache
const PACK_BYTES = KC * (NC + 8) * 4;
const THREADS = Math.min(Number(process.env.OMP_NUM_THREADS) || availableParallelism(), 16);
const HELPERS = Math.max(THREADS - 1, 0);
const CHUNKS_PER_THREAD = 4; // more, smaller chunks even out a thread that falls behind
const ALONE = 1 << 20; // multiply-adds under which a product stays on this thread

const memory = new WebAssembly.Memory({ initial: 1, maximum: PAGE, shared: true });
const plain = new WebAssembly.Module(readFileSync(new URL("./kernel.wasm", import.meta.url)));
const fused = fusedKernel();
const module = fused ?? plain;
const wasm = instance(module);
/** Which kernel multiplies: "fma" (relaxed SIMD's fused multiply-add) or "simd". */
export const KERNEL = fused ? "fma" : "simd";
const ownBuffers = new WeakSet<ArrayBufferLike>([memory.buffer]);
let top = PAGE; // the first page is never handed out
let heap = new Float32Array(memory.buffer); // all of it: made again only when it grows

function instance(m: WebAssembly.Module): Exports {
  return new WebAssembly.Instance(m, { env: { memory } }).exports as unknown as Exports;
}

// kernel-fma.wasm, when this Node runs relaxed SIMD (by default from Node 21; Node 20 with
// --experimental-wasm-relaxed-simd, which the grader passes) and it multiplies a small case of
// whole numbers exactly as the plain kernel does; else null (the plain kernel is used)
function fusedKernel(): WebAssembly.Module | null {
  const bytes = readBeside("kernel-fma.wasm");
  if (!bytes || !WebAssembly.validate(bytes)) return null;
  try {
    const candidate = new WebAssembly.Module(bytes);
    const a = tinyProduct(instance(candidate));
    const b = tinyProduct(instance(plain));
    return a.every((v, i) => v === b[i]) ? candidate : null;
  } catch {
    return null; // one that does not link, or traps: the plain kernel
  }
}

function readBeside(name: string) {
  try {
    return readFileSync(new URL(`./${name}`, import.meta.url));
  } catch {
    return null; // a course without it runs the plain kernel
  }
}

// [4, 8] @ [8, 8] + 1 through gemm, in the first page (never handed out): whole numbers, so
// every sum is exact, fused or not
function tinyProduct(k: Exports): Float32Array {
  const view = new Float32Array(memory.buffer, 0, 512); // byte offsets below
  for (let i = 0; i < 96; i++) view[i] = (i % 7) - 3; // X [4, 8] at 0, W [8, 8] at 128
  view.fill(1, 128, 160); // OUT [4, 8] at 512, starting as the bias
  k.packx(0, 32, 4, 8, 1024); // X packed at 1024; W packed by gemm at 1536
  k.gemm(1024, 128, 32, 4, 512, 32, 4, 8, 0, 8, 1536, 8, 8);
  const out = view.slice(128, 160);
  view.fill(0);
  return out;
}

// --- memory ---------------------------------------------------------------------------------

// `bytes` of kernel memory, kept for good, starting `skew` bytes before a 64-byte boundary
function reserve(bytes: number, skew = 0): number {
  const at = Math.ceil((top + skew) / 64) * 64 - skew;
  top = at + bytes;
  const pages = Math.ceil(top / PAGE) - memory.buffer.byteLength / PAGE;
  if (pages > 0) memory.grow(pages);
  ownBuffers.add(memory.buffer); // views made before a grow stay valid: the memory is shared
  if (pages > 0) heap = new Float32Array(memory.buffer);
  return at;
}

// `size` bytes of kernel memory for a weights file, placed so that its data section (at
// `dataStart` in the file) is 64-byte aligned: its tensors are then views the kernel reads.
export function weightBytes(size: number, dataStart: number): Uint8Array {
  const at = reserve(size, dataStart % 64);
  return new Uint8Array(memory.buffer, at, size);
}

const READ_BLOCK = 1 << 20; // bytes of the file a thread reads at a time

// The whole open file (`size` bytes) into kernel memory, as weightBytes places it, read by
// every kernel thread at once: most of a read into fresh memory is the system mapping its pages
// in, which the cores do side by side (measured: 0.55 s -> 0.3 s for GPT-2's 500 MB on two).
export function readWeights(fd: number, size: number, dataStart: number): Uint8Array {
  const bytes = weightBytes(size, dataStart);
  const blocks = Math.ceil(size / READ_BLOCK);
  const width = Math.ceil(blocks / (THREADS * CHUNKS_PER_THREAD));
  if (blocks > 0) run([READ, width, [fd, bytes.byteOffset, size]], blocks, 0, blocks < 2 * THREADS);
  return bytes;
}

// bytes [from, to) of the file into kernel memory at `at` onwards (the file's byte 0 at `at`)
function readRange(fd: number, at: number, from: number, to: number): void {
  const into = new Uint8Array(memory.buffer, at, to);
  while (from < to) {
    const got = readSync(fd, into, from, Math.min(to - from, READ_BLOCK), from);
    if (got === 0) throw new Error("loadWeights: the file ended before its size");
    from += got;
  }
}

let scratchAt = 0;
let scratchSize = 0;

// room for one product's copies and output, reused by the next; grown when one needs more
function scratch(bytes: number): number {
  if (bytes > scratchSize) {
    scratchSize = Math.max(bytes, 2 * scratchSize);
    scratchAt = reserve(scratchSize);
  }
  return scratchAt;
}

function floats(at: number, n: number): Float32Array {
  return heap.subarray(at >>> 2, (at >>> 2) + n); // >>>: addresses past 2 GiB stay positive
}

function align(at: number): number {
  return Math.ceil(at / 64) * 64;
}

function copyRows(rows: Float32Array[], at: number): void {
  let to = at >>> 2;
  for (const row of rows) {
    heap.set(row, to);
    to += row.length;
  }
}

// --- the products ---------------------------------------------------------------------------

// X [n, d] @ W + b -> [n, m], where W is [d, m], or [m, d] when transposed (the product is then
// X @ W^T); W is one row-major array, or its rows. Returns n rows, views into one new array.
export function product(
  X: Float32Array[],
  W: Float32Array | Float32Array[],
  d: number,
  m: number,
  b?: Float32Array,
  transposed = false,
): Float32Array[] {
  checkShapes(X, W, d, m, b, transposed);
  const n = X.length;
  const n4 = Math.ceil(n / 4) * 4; // the tiles' rows: X packed in fours, zeros past n
  const ldo = Math.ceil(m / 8) * 8; // room for the last 8-wide tile
  const inPlace = !Array.isArray(W) && ownBuffers.has(W.buffer);
  // one row through a W that is copied in anyway (attention's weighted sum over any number of
  // rows): zero rows, and zeros in x, up to a multiple of 4, so the one-row path takes it
  const dp = n === 1 && !inPlace && !transposed ? Math.ceil(d / 4) * 4 : d;
  const [xBytes, xpBytes, outBytes] = [n * dp * 4, n4 * dp * 4, n4 * ldo * 4];
  const wBytes = inPlace ? 0 : dp * m * 4;
  const x = scratch(xBytes + xpBytes + outBytes + wBytes + THREADS * PACK_BYTES + 4 * 64);
  const xp = align(x + xBytes), out = align(xp + xpBytes);
  const w = align(out + outBytes), pack = align(w + wBytes);
  copyRows(X, x);
  if (Array.isArray(W)) copyRows(W, w);
  else if (!inPlace) floats(w, W.length).set(W);
  if (dp > d) {
    heap.fill(0, (x >>> 2) + d, (x >>> 2) + dp); // x's padding
    heap.fill(0, (w >>> 2) + d * m, (w >>> 2) + dp * m); // W's
  }
  const o = floats(out, n * ldo);
  for (let i = 0; i < n; i++) b ? o.set(b, i * ldo) : o.fill(0, i * ldo, i * ldo + m);
  const at = inPlace ? (W as Float32Array).byteOffset : w;
  const alone = n * d * m < ALONE; // too small to be worth waking a helper
  if (n > 0 && d > 0 && m > 0) run(plan({ x, xp, w: at, out, n, d: dp, m, ldo, transposed }), m, pack, alone);
  const result = floats(out, n * ldo).slice(); // out of the scratch area, into the caller's hands
  return X.map((_, i) => result.subarray(i * ldo, i * ldo + m));
}

function checkShapes(
  X: Float32Array[],
  W: Float32Array | Float32Array[],
  d: number,
  m: number,
  b: Float32Array | undefined,
  transposed: boolean,
): void {
  const refuse = (what: string) => {
    throw new RangeError(`matmul: ${what}`);
  };
  for (const x of X) if (x.length !== d) refuse(`a row of ${x.length} values, W has ${d} rows`);
  if (!Array.isArray(W) && W.length !== d * m) refuse(`W has ${W.length} values, not ${d} x ${m}`);
  const width = transposed ? d : m;
  if (Array.isArray(W) && W.some((r) => r.length !== width)) refuse(`W's rows are not all ${width} long`);
  if (b && b.length !== m) refuse(`a bias of ${b.length} values for ${m} columns`);
}

interface Job {
  x: number;
  xp: number; // where X packed in fours goes (gemm)
  w: number;
  out: number;
  n: number;
  d: number;
  m: number;
  ldo: number;
  transposed: boolean;
}

const GEMM = 0, GEMV = 1, GEMVT = 2, READ = 3;

// The routine for a product, the width of a chunk of its output columns, and its arguments
// before the column range: a one-row product streams W once; any other packs X in fours (once,
// here) and W in blocks (by each thread, for its columns).
function plan(job: Job): [number, number, number[]] {
  const { x, xp, w, out, n, d, m, ldo, transposed } = job;
  const width = (unit: number) => Math.ceil(m / (THREADS * CHUNKS_PER_THREAD) / unit) * unit;
  if (n === 1 && d % 4 === 0) {
    return [transposed ? GEMVT : GEMV, width(4), [x, w, transposed ? d * 4 : m * 4, out, d]];
  }
  wasm.packx(x, d * 4, n, d, xp);
  const [sk, sj] = transposed ? [4, d * 4] : [m * 4, 4];
  return [GEMM, width(8), [xp, w, sk, sj, out, ldo * 4, Math.ceil(n / 4) * 4, d]];
}

// one routine over the output columns [j0, j1); `pack` is the calling thread's own area
function work(kind: number, args: number[], j0: number, j1: number, pack: number): void {
  if (kind === GEMM) wasm.gemm(...args, j0, j1, pack, KC, NC);
  else if (kind === GEMV) wasm.gemv(args[0], args[1], args[2], args[3], args[4], j0, j1);
  else if (kind === GEMVT) wasm.gemvt(args[0], args[1], args[2], args[3], args[4], j0, j1);
  else readRange(args[0], args[1] >>> 0, j0 * READ_BLOCK, Math.min(j1 * READ_BLOCK, args[2] >>> 0));
}

// --- threads --------------------------------------------------------------------------------

// The shared control block. TICKET holds the job's generation (high 16 bits) and its next
// chunk (low 16): a thread takes a chunk by a compare-and-swap that fails once the job is over,
// so a helper that wakes late never takes a chunk of the next job with this one's arguments
// (they are written after TICKET moves on, and read before a chunk is taken).
const GEN = 0, TICKET = 1, DONE = 2, KIND = 3, WIDTH = 4, COLS = 5, PACK = 6, FAILED = 7;
const NARGS = 8, ARGS = 9;
const control = new Int32Array(new SharedArrayBuffer(32 * 4));

function run(
  [kind, width, args]: [number, number, number[]],
  m: number,
  pack: number,
  alone: boolean,
): void {
  const chunks = Math.ceil(m / width);
  // one row through W as stored streams memory that one core already keeps busy: measured
  // (benchmarks/ts_kernel.py), waking a helper costs it more than the helper brings
  if (HELPERS === 0 || chunks === 1 || kind === GEMV || alone) return work(kind, args, 0, m, pack);
  startHelpers();
  const gen = (control[GEN] + 1) & 0x7fff;
  Atomics.store(control, TICKET, gen << 16);
  control.set([kind, width, m, pack], KIND);
  control[NARGS] = args.length;
  control.set(args, ARGS);
  Atomics.store(control, DONE, 0);
  Atomics.store(control, GEN, gen);
  Atomics.notify(control, GEN);
  const own = pack + HELPERS * PACK_BYTES; // helper i packs at pack + i * PACK_BYTES
  let failure: unknown = null; // this thread's: thrown only once every chunk is done
  for (let c = take(gen, chunks); c >= 0; c = take(gen, chunks)) {
    try {
      work(kind, args, c * width, Math.min((c + 1) * width, m), own);
    } catch (err) {
      failure ??= err;
    }
    Atomics.add(control, DONE, 1);
  }
  // wait only for the chunks a helper took and has not finished: a job ends, even a failed
  // one, with no helper still in it and the failure flag clear for the next
  for (let done; (done = Atomics.load(control, DONE)) < chunks; ) Atomics.wait(control, DONE, done);
  const helperFailed = Atomics.exchange(control, FAILED, 0);
  if (failure) throw failure;
  if (helperFailed) {
    throw new Error(kind === READ ? "loadWeights: a kernel thread could not read the file"
      : "matmul: a kernel thread failed");
  }
}

// the next chunk of job `gen`, or -1 when none is left
function take(gen: number, chunks: number): number {
  for (;;) {
    const ticket = Atomics.load(control, TICKET);
    if (ticket >>> 16 !== gen || (ticket & 0xffff) >= chunks) return -1;
    if (Atomics.compareExchange(control, TICKET, ticket, ticket + 1) === ticket) return ticket & 0xffff;
  }
}

// A helper's loop, run from this text (no file to find, no TypeScript loader to start)
const HELPER_SOURCE = `
const { workerData } = require("node:worker_threads");
const { readSync } = require("node:fs");
const { module, memory, control, index, packBytes, KC, NC, READ_BLOCK } = workerData;
const wasm = new WebAssembly.Instance(module, { env: { memory } }).exports;
const [GEN, TICKET, DONE, KIND, WIDTH, COLS, PACK, FAILED, NARGS, ARGS] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
let seen = 0;
for (;;) {
  Atomics.wait(control, GEN, seen);
  const gen = (seen = Atomics.load(control, GEN));
  const [kind, width, cols, pack] = control.subarray(KIND, PACK + 1);
  const args = Array.from(control.subarray(ARGS, ARGS + control[NARGS]));
  const chunks = Math.ceil(cols / width), own = pack + index * packBytes;
  for (;;) {
    const ticket = Atomics.load(control, TICKET);
    if (ticket >>> 16 !== gen || (ticket & 0xffff) >= chunks) break;
    if (Atomics.compareExchange(control, TICKET, ticket, ticket + 1) !== ticket) continue;
    const j0 = (ticket & 0xffff) * width, j1 = Math.min(j0 + width, cols);
    try {
      if (kind === 0) wasm.gemm(...args, j0, j1, own, KC, NC);
      else if (kind === 1) wasm.gemv(args[0], args[1], args[2], args[3], args[4], j0, j1);
      else if (kind === 2) wasm.gemvt(args[0], args[1], args[2], args[3], args[4], j0, j1);
      else readRange(args[0], args[1] >>> 0, j0 * READ_BLOCK, Math.min(j1 * READ_BLOCK, args[2] >>> 0));
    } catch {
      Atomics.store(control, FAILED, 1); // counted as done all the same: the caller must not hang
    }
    Atomics.add(control, DONE, 1);
    Atomics.notify(control, DONE);
  }
}

function readRange(fd, at, from, to) { // as kernel.ts's
  const into = new Uint8Array(memory.buffer, at, to);
  while (from < to) {
    const got = readSync(fd, into, from, Math.min(to - from, READ_BLOCK), from);
    if (got === 0) throw new Error("the file ended before its size");
    from += got;
  }
}
`;

let helpers: Worker[] | null = null;

function startHelpers(): void {
  if (helpers) return;
  helpers = Array.from({ length: HELPERS }, (_, index) => {
    const workerData = { module, memory, control, index, packBytes: PACK_BYTES, KC, NC, READ_BLOCK };
    const helper = new Worker(HELPER_SOURCE, { eval: true, execArgv: [], workerData });
    helper.unref(); // a finished program exits without waiting for its helpers
    return helper;
  });
}

// --- the elementwise functions --------------------------------------------------------------

// in place: values[0..length) -> their softmax, in float32 with the kernel's e^x
export function softmaxInPlace(values: Float32Array | number[], length: number): void {
  if (length <= 0) return;
  const padded = Math.ceil(length / 4) * 4;
  const at = scratch(padded * 4);
  const inKernel = floats(at, padded);
  const given = Math.min(length, values.length);
  inKernel.set(given === values.length ? values : values.slice(0, given));
  inKernel.fill(NaN, given, length); // past the end of values: NaN, as reading it in JS gives
  inKernel.fill(-Infinity, length); // e^-inf is 0: the padding adds nothing
  wasm.softmax(at, padded);
  copyBack(inKernel, values, given);
}

// in place: GELU (the tanh form) of every value of every row
export function geluInPlace(rows: Float32Array[]): void {
  for (const row of rows) {
    const padded = Math.ceil(row.length / 4) * 4;
    const at = scratch(padded * 4);
    const inKernel = floats(at, padded);
    inKernel.set(row);
    wasm.gelu(at, padded);
    row.set(inKernel.subarray(0, row.length));
  }
}

function copyBack(from: Float32Array, to: Float32Array | number[], length: number): void {
  if (to instanceof Float32Array) to.set(from.subarray(0, length));
  else for (let i = 0; i < length; i++) to[i] = from[i];
}
