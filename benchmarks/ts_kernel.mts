// The Node side of benchmarks/ts_kernel.py: times one candidate for the TypeScript course's
// matrix products on GPT-2's shapes and prints one JSON line of GFLOP/s per shape.
//
//   node --import tsx benchmarks/ts_kernel.mts COURSE_DIR CANDIDATE [TFJS_NODE_MODULES]
//
// CANDIDATE: "wasm" (the course's src/kernel.ts; its threads follow OMP_NUM_THREADS), "js"
// (the plain JavaScript product the course shipped before it), or "tfjs" (TensorFlow.js's
// WebAssembly backend, XNNPACK, from a node_modules folder given as the third argument).

import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

type Product = (X: Float32Array[], W: Float32Array, d: number, m: number, t: boolean) => unknown;

// [n, d, m, W transposed]: a 1024-token prefill's projections and MLP, a decode step's, and the
// tied unembedding of one row
const SHAPES: [number, number, number, boolean][] = [
  [1024, 768, 2304, false],
  [1024, 768, 3072, false],
  [1024, 3072, 768, false],
  [128, 768, 3072, false],
  [1, 768, 3072, false],
  [1, 3072, 768, false],
  [1, 768, 50257, true],
];
const FLOPS_PER_TRY = 4e9; // repeat a shape until about this much work, then keep the best
const MAX_REPEATS = 200;

function plainJs(X: Float32Array[], W: Float32Array, d: number, m: number, t: boolean) {
  // gpt2.ts's matmul before the kernel: W^T made once, then 4 x 4 blocks of dot products
  const T = t ? W : transpose(W, d, m);
  return X.length && blocked4x4(X, T, d, m);
}

const transposedOnce = new WeakMap<Float32Array, Float32Array>();
function transpose(W: Float32Array, d: number, m: number): Float32Array {
  let T = transposedOnce.get(W);
  if (!T) {
    T = new Float32Array(d * m);
    for (let k = 0; k < d; k++) for (let j = 0; j < m; j++) T[j * d + k] = W[k * m + j];
    transposedOnce.set(W, T);
  }
  return T;
}

function blocked4x4(X: Float32Array[], T: Float32Array, d: number, m: number): Float32Array[] {
  const out = X.map(() => new Float32Array(m));
  const last = X.length - 1;
  for (let i = 0; i < X.length; i += 4) {
    const x0 = X[i], x1 = X[Math.min(i + 1, last)], x2 = X[Math.min(i + 2, last)];
    const x3 = X[Math.min(i + 3, last)];
    for (let j = 0; j < m; j += 4) {
      const c0 = j * d, c1 = Math.min(j + 1, m - 1) * d, c2 = Math.min(j + 2, m - 1) * d;
      const c3 = Math.min(j + 3, m - 1) * d;
      let s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
      let s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
      for (let k = 0; k < d; k++) {
        const a0 = x0[k], a1 = x1[k], a2 = x2[k], a3 = x3[k];
        const w0 = T[c0 + k], w1 = T[c1 + k], w2 = T[c2 + k], w3 = T[c3 + k];
        s00 += a0 * w0; s01 += a0 * w1; s02 += a0 * w2; s03 += a0 * w3;
        s10 += a1 * w0; s11 += a1 * w1; s12 += a1 * w2; s13 += a1 * w3;
        s20 += a2 * w0; s21 += a2 * w1; s22 += a2 * w2; s23 += a2 * w3;
        s30 += a3 * w0; s31 += a3 * w1; s32 += a3 * w2; s33 += a3 * w3;
      }
      const sums = [[s00, s01, s02, s03], [s10, s11, s12, s13], [s20, s21, s22, s23],
        [s30, s31, s32, s33]];
      for (let r = 0; r < 4 && i + r < X.length; r++) {
        for (let c = 0; c < 4 && j + c < m; c++) out[i + r][j + c] += sums[r][c];
      }
    }
  }
  return out;
}

async function tfjsProduct(modules: string): Promise<Product> {
  const require = createRequire(path.join(path.resolve(modules), "x.js"));
  const tf = require("@tensorflow/tfjs-core");
  require("@tensorflow/tfjs-backend-wasm");
  await tf.setBackend("wasm");
  return (X, W, d, m, t) => {
    const x = tf.tensor2d(flatten(X), [X.length, d]);
    const w = tf.tensor2d(W, t ? [m, d] : [d, m]);
    const y = tf.matMul(x, w, false, t);
    const rows = y.dataSync();
    tf.dispose([x, w, y]);
    return rows;
  };
}

function flatten(X: Float32Array[]): Float32Array {
  const out = new Float32Array(X.length * (X[0]?.length ?? 0));
  X.forEach((x, i) => out.set(x, i * x.length));
  return out;
}

async function candidate(course: string, name: string, extra?: string): Promise<Product> {
  if (name === "js") return plainJs;
  if (name === "tfjs") return tfjsProduct(extra ?? "node_modules");
  const kernel = await import(pathToFileURL(path.join(course, "src", "kernel.ts")).href);
  console.error(`kernel: ${kernel.KERNEL}`); // which binary multiplies: fma or simd
  // the weights live in the kernel's memory: put W there as loadWeights does
  return (X, W, d, m, t) => kernel.product(X, inKernel(kernel, W), d, m, undefined, t);
}

const placed = new WeakMap<Float32Array, Float32Array>();
function inKernel(kernel: any, W: Float32Array): Float32Array {
  let at = placed.get(W);
  if (!at) {
    const bytes: Uint8Array = kernel.weightBytes(W.byteLength, 0);
    at = new Float32Array(bytes.buffer, bytes.byteOffset, W.length);
    at.set(W);
    placed.set(W, at);
  }
  return at;
}

function random(n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.random() - 0.5;
  return a;
}

async function main(): Promise<void> {
  const [course, name, extra] = process.argv.slice(2);
  const multiply = await candidate(course, name, extra);
  const rates: Record<string, number> = {};
  for (const [n, d, m, t] of SHAPES) {
    const X = Array.from({ length: n }, () => random(d));
    const W = random(d * m);
    const flops = 2 * n * d * m;
    multiply(X, W, d, m, t); // warm: compiled, packed, threads started
    const repeats = Math.max(1, Math.min(MAX_REPEATS, Math.round(FLOPS_PER_TRY / flops)));
    let best = Infinity;
    for (let r = 0; r < repeats; r++) {
      const start = performance.now();
      multiply(X, W, d, m, t);
      best = Math.min(best, (performance.now() - start) / 1000);
      if (name === "js" && r >= 2) break; // minutes otherwise; three tries tell its rate
    }
    rates[`${n}x${d}x${m}${t ? "T" : ""}`] = flops / best / 1e9;
  }
  console.log(JSON.stringify(rates));
  process.exit(0);
}

await main();
