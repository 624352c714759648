// GPT-2 without a cache: PROVIDED, complete. Your building blocks, and the recompute path.
//
// Every function here recomputes from scratch. Your src/kvcache.ts reuses the pieces (lnRows,
// qkv, mlp, unembed, embed) and changes only attention. Weights use the Hugging Face names
// (wte, wpe, h.{layer}.attn.c_attn, ...); GPT-2's Conv1D weights are stored [in, out], so every
// projection is `x @ W + b`. A sequence of vectors is an array of rows: Rows = Float32Array[].

import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { geluInPlace, product, readWeights, softmaxInPlace } from "./kernel.ts";

export const HEAD_DIM = 64; // every GPT-2 size uses 64-wide heads

export interface Tensor {
  shape: number[];
  data: Float32Array; // row-major, a view into the checkpoint (never copied per tensor)
}
export type Weights = Record<string, Tensor>;
export type Rows = Float32Array[];

const loaded = new Map<string, Weights>();

// Read a .safetensors checkpoint once; the path defaults to $THEINFERENCE_WEIGHTS.
export async function loadWeights(path?: string): Promise<Weights> {
  return loadWeightsSync(path);
}

export function loadWeightsSync(path?: string): Weights {
  const file = path ?? process.env.THEINFERENCE_WEIGHTS;
  if (!file) throw new Error("no weights path: set THEINFERENCE_WEIGHTS or pass one");
  const cached = loaded.get(file);
  if (cached) return cached;
  const fd = openSync(file, "r");
  try {
    const size = fstatSync(fd).size;
    const head = Buffer.alloc(8);
    readSync(fd, head, 0, 8, 0);
    const dataStart = 8 + Number(head.readBigUInt64LE(0));
    // the whole file goes into the kernel's memory, where matmul reads the weights as they are
    const bytes = readWeights(fd, size, dataStart);
    const header = JSON.parse(Buffer.from(bytes.subarray(8, dataStart)).toString("utf8"));
    delete header.__metadata__;
    const w: Weights = {};
    for (const [name, t] of Object.entries<any>(header)) {
      if (t.dtype !== "F32") throw new Error(`${name}: dtype ${t.dtype}, expected F32`);
      const [from, to] = t.data_offsets as [number, number];
      const start = bytes.byteOffset + dataStart + from;
      w[name] = { shape: t.shape, data: new Float32Array(bytes.buffer, start, (to - from) / 4) };
    }
    loaded.set(file, w);
    return w;
  } finally {
    closeSync(fd);
  }
}

export function nLayer(w: Weights): number {
  return Object.keys(w).filter((name) => name.endsWith(".ln_1.weight")).length;
}

export function nHead(w: Weights): number {
  return w["wte.weight"].shape[1] / HEAD_DIM;
}

export function nCtx(w: Weights): number {
  return w["wpe.weight"].shape[0];
}

// [n, d] @ W [d, m] + b [m] -> [n, m]. W is a weight, or rows of your own (d rows of m). The
// products here run in the WebAssembly kernel (kernel.ts), on every core.
export function matmul(X: Rows, W: Tensor | Rows, b?: Tensor): Rows {
  if (Array.isArray(W)) return product(X, W, W.length, W[0]?.length ?? 0, b?.data);
  const [d, m] = W.shape;
  return product(X, W.data, d, m, b?.data);
}

// [n, d] and [m, d] -> [n, m]: every row of X dotted with every row of Y, X @ Y^T. Y is rows
// of your own, or one [m, d] array (a Tensor).
export function matmulT(X: Rows, Y: Tensor | Rows): Rows {
  if (!Array.isArray(Y)) return product(X, Y.data, Y.shape[1], Y.shape[0], undefined, true);
  return product(X, Y, X[0]?.length ?? Y[0]?.length ?? 0, Y.length, undefined, true);
}

// [n, d] -> [n, HEAD_DIM]: head h's columns of every row (views, not copies)
export function head(X: Rows, h: number): Rows {
  return X.map((x) => x.subarray(h * HEAD_DIM, (h + 1) * HEAD_DIM));
}

// [n] . [n] -> a number. Four running sums: each waits on its own adds, not on the others'
export function dot(a: Float32Array, b: Float32Array): number {
  let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  let i = 0;
  for (; i + 3 < a.length; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < a.length; i++) s0 += a[i] * b[i];
  return s0 + s1 + (s2 + s3);
}

export function gelu(x: number): number {
  // tanh approximation, as GPT-2 was trained with
  return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x * x * x)));
}

// in place: scores -> probabilities (only the first `length` entries): e^(s - max) / their sum,
// the max taken out so that no e^s overflows. Runs in the kernel (float32, SIMD).
export function softmax(scores: Float32Array | number[], length = scores.length): void {
  softmaxInPlace(scores, length);
}

// [n, d] -> [n, d]: LayerNorm each row (eps 1e-5)
export function lnRows(X: Rows, g: Tensor, b: Tensor): Rows {
  return X.map((x) => {
    let mean = 0;
    for (let i = 0; i < x.length; i++) mean += x[i];
    mean /= x.length;
    let variance = 0;
    for (let i = 0; i < x.length; i++) variance += (x[i] - mean) ** 2;
    const inv = 1 / Math.sqrt(variance / x.length + 1e-5);
    const out = new Float32Array(x.length);
    for (let i = 0; i < x.length; i++) out[i] = (x[i] - mean) * inv * g.data[i] + b.data[i];
    return out;
  });
}

// one row of a [rows, cols] tensor, as a view
export function row(t: Tensor, i: number): Float32Array {
  const cols = t.shape[1];
  return t.data.subarray(i * cols, (i + 1) * cols);
}

// [n] -> [n, d]: token embedding plus absolute position 0..n-1
export function embed(ids: number[], w: Weights): Rows {
  return ids.map((id, pos) => {
    const out = Float32Array.from(row(w["wte.weight"], id));
    const p = row(w["wpe.weight"], pos);
    for (let i = 0; i < out.length; i++) out[i] += p[i];
    return out;
  });
}

// [n, d] (already layer-normed) -> q, k, v each [n, d], all heads concatenated
export function qkv(H: Rows, w: Weights, layer: number): [Rows, Rows, Rows] {
  const p = `h.${layer}.attn.c_attn.`;
  const all = matmul(H, w[p + "weight"], w[p + "bias"]);
  const d = all[0] ? all[0].length / 3 : 0;
  return [0, 1, 2].map((part) => all.map((r) => r.subarray(part * d, (part + 1) * d))) as [
    Rows,
    Rows,
    Rows,
  ];
}

// [n, d] + [n, d] -> [n, d]
export function addRows(X: Rows, Y: Rows): Rows {
  return X.map((x, t) => {
    const y = Y[t], out = new Float32Array(x.length);
    for (let i = 0; i < x.length; i++) out[i] = x[i] + y[i];
    return out;
  });
}

// [n, d] -> [n, d]: masked self-attention over every row, residual included
export function attnSublayer(X: Rows, w: Weights, layer: number): Rows {
  const p = `h.${layer}.`;
  const H = lnRows(X, w[p + "ln_1.weight"], w[p + "ln_1.bias"]);
  const [q, k, v] = qkv(H, w, layer);
  const a: Rows = X.map(() => new Float32Array(X[0].length));
  for (let h = 0; h < nHead(w); h++) {
    const scores = matmulT(head(q, h), head(k, h)); // [n, n]: every query against every key
    scores.forEach((s, t) => {
      for (let j = 0; j <= t; j++) s[j] /= Math.sqrt(HEAD_DIM);
      softmax(s, t + 1); // causal: token t sees 0..t
      s.fill(0, t + 1);
    });
    const out = matmul(scores, head(v, h)); // [n, HEAD_DIM]: each row's weighted sum of values
    out.forEach((o, t) => a[t].set(o, h * HEAD_DIM));
  }
  return addRows(X, matmul(a, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]));
}

// [n, d] (already layer-normed) -> [n, d], without the residual
export function mlp(H: Rows, w: Weights, layer: number): Rows {
  const p = `h.${layer}.mlp.`;
  const up = matmul(H, w[p + "c_fc.weight"], w[p + "c_fc.bias"]); // [n, 4d]
  geluInPlace(up); // gelu() on every value, in the kernel
  return matmul(up, w[p + "c_proj.weight"], w[p + "c_proj.bias"]);
}

// [n, d] -> [n, d]: attention sublayer, then the MLP sublayer, each with its residual
export function block(X: Rows, w: Weights, layer: number): Rows {
  const p = `h.${layer}.`;
  X = attnSublayer(X, w, layer);
  return addRows(X, mlp(lnRows(X, w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer));
}

// [d] -> [vocab]: tied embedding, h @ wte^T (apply ln_f first)
export function unembed(h: Float32Array, w: Weights): Float32Array {
  const [vocab, d] = w["wte.weight"].shape;
  return product([h], w["wte.weight"].data, d, vocab, undefined, true)[0];
}

// [n] -> [n, vocab]: the whole model from scratch, every position
export function recomputeLogits(ids: number[], w: Weights): Rows {
  let X = embed(ids, w);
  for (let layer = 0; layer < nLayer(w); layer++) X = block(X, w, layer);
  return lnRows(X, w["ln_f.weight"], w["ln_f.bias"]).map((h) => unembed(h, w));
}

// What a stub throws until it is written: the grader reports it as "todo", not as an error.
export class NotImplementedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NotImplementedError";
  }
}
