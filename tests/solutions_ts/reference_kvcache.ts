// Reference solution for src/kvcache.ts: every stage passes. Never shipped to students.
//
// The planted-bug tests edit this text (see bugs.toml), so each line a bug touches is kept
// unique and plain.

import {
  HEAD_DIM,
  type Rows,
  type Weights,
  addRows,
  block,
  embed,
  head,
  lnRows,
  matmul,
  matmulT,
  mlp,
  nCtx,
  nHead,
  nLayer,
  qkv,
  recomputeLogits,
  softmax,
  unembed,
} from "./gpt2.ts";

export { NotImplementedError, embed, loadWeights } from "./gpt2.ts";

// Each head's keys (and values) are one array, the rows back to back with room to grow, so that
// attention hands the kernel one array, not a row at a time; k and v give them as rows.
export class LayerCache {
  kData: Float32Array[]; // [head] -> [room * HEAD_DIM], the first `length` rows in use
  vData: Float32Array[];
  length = 0;

  constructor(heads = 12) {
    this.kData = Array.from({ length: heads }, () => new Float32Array(0));
    this.vData = Array.from({ length: heads }, () => new Float32Array(0));
  }

  // [nHead, length, HEAD_DIM]: views of the rows in use
  get k(): Float32Array[][] {
    return this.kData.map((data) => rowsOf(data, this.length));
  }

  get v(): Float32Array[][] {
    return this.vData.map((data) => rowsOf(data, this.length));
  }
}

function rowsOf(data: Float32Array, length: number): Float32Array[] {
  return Array.from({ length }, (_, t) => data.subarray(t * HEAD_DIM, (t + 1) * HEAD_DIM));
}

export class ModelCache {
  layers: LayerCache[];

  constructor(layers = 12, heads = 12) {
    this.layers = Array.from({ length: layers }, () => new LayerCache(heads));
  }
}

export function freshCache(w: Weights): ModelCache {
  return new ModelCache(nLayer(w), nHead(w));
}

// rows [n_new, HEAD_DIM] written after the first `length` rows of data, grown when full
function appendRows(data: Float32Array, length: number, rows: Float32Array[]): Float32Array {
  const needed = (length + rows.length) * HEAD_DIM;
  if (needed > data.length) {
    const grown = new Float32Array(2 * needed); // doubling: appends stay cheap
    grown.set(data.subarray(0, length * HEAD_DIM));
    data = grown;
  }
  rows.forEach((row, i) => data.set(row, (length + i) * HEAD_DIM));
  return data;
}

// k, v: [n_new, d] rows appended to every head's history
function appendKv(cache: LayerCache, k: Rows, v: Rows): void {
  for (let h = 0; h < cache.kData.length; h++) {
    cache.kData[h] = appendRows(cache.kData[h], cache.length, head(k, h));
    cache.vData[h] = appendRows(cache.vData[h], cache.length, head(v, h));
  }
  cache.length += k.length;
}

// q [d] of the newest token over `upto` cached rows -> [d] merged heads, before c_proj
function attendRows(q: Float32Array, cache: LayerCache, upto: number): Float32Array {
  const out = new Float32Array(q.length);
  for (let h = 0; h < cache.kData.length; h++) {
    const qh = q.subarray(h * HEAD_DIM, (h + 1) * HEAD_DIM);
    const rows = (data: Float32Array) => ({ shape: [upto, HEAD_DIM], data: data.subarray(0, upto * HEAD_DIM) });
    const keys = rows(cache.kData[h]), values = rows(cache.vData[h]); // [upto, HEAD_DIM] each
    const scores = matmulT([qh], keys)[0]; // [upto]: the query against every key
    for (let j = 0; j < upto; j++) scores[j] /= Math.sqrt(HEAD_DIM);
    softmax(scores, upto);
    out.set(matmul([scores], values)[0], h * HEAD_DIM); // [HEAD_DIM]: the values, weighted
  }
  return out;
}

function attend(q: Float32Array, cache: LayerCache, w: Weights, layer: number): Float32Array {
  const upto = cache.length;
  const a = attendRows(q, cache, upto);
  const p = `h.${layer}.attn.c_proj.`;
  return matmul([a], w[p + "weight"], w[p + "bias"])[0];
}

export function attnStep(lnHidden: Float32Array, w: Weights, layer: number, cache: LayerCache) {
  const [q, k, v] = qkv([lnHidden], w, layer);
  appendKv(cache, k, v);
  return attend(q[0], cache, w, layer);
}

export function layerAttnIncremental(X: Rows, w: Weights, layer: number): Rows {
  const p = `h.${layer}.`;
  const cache = new LayerCache(nHead(w));
  return X.map((x) => {
    const h = lnRows([x], w[p + "ln_1.weight"], w[p + "ln_1.bias"])[0];
    const a = attnStep(h, w, layer, cache);
    return x.map((value, i) => value + a[i]);
  });
}

export function embedToken(tokenId: number, position: number, w: Weights): Float32Array {
  const d = w["wte.weight"].shape[1];
  const out = w["wte.weight"].data.slice(tokenId * d, (tokenId + 1) * d);
  const pos = w["wpe.weight"].data.subarray(position * d, (position + 1) * d);
  for (let i = 0; i < d; i++) out[i] += pos[i];
  return out;
}

// the prompt's queries over its own keys and values, all [n, d] -> [n, d] merged heads
function attendPrompt(q: Rows, k: Rows, v: Rows, heads: number): Rows {
  const a: Rows = q.map(() => new Float32Array(q[0].length));
  for (let h = 0; h < heads; h++) {
    const scores = matmulT(head(q, h), head(k, h)); // [n, n]
    scores.forEach((s, t) => {
      const upto = t + 1; // causal: row t sees 0..t
      for (let j = 0; j < upto; j++) s[j] /= Math.sqrt(HEAD_DIM);
      softmax(s, upto);
      s.fill(0, upto);
    });
    matmul(scores, head(v, h)).forEach((out, t) => a[t].set(out, h * HEAD_DIM));
  }
  return a;
}

// [n, d] -> [n, d]: one block over the whole prompt, writing its K/V rows into cache
function prefillLayer(X: Rows, w: Weights, layer: number, cache: LayerCache): Rows {
  const p = `h.${layer}.`;
  const H = lnRows(X, w[p + "ln_1.weight"], w[p + "ln_1.bias"]);
  const [q, k, v] = qkv(H, w, layer);
  appendKv(cache, k, v); // the prompt's K/V, kept for decoding
  const a = attendPrompt(q, k, v, nHead(w));
  X = addRows(X, matmul(a, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]));
  return addRows(X, mlp(lnRows(X, w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer));
}

function finalLogits(x: Float32Array, w: Weights): Float32Array {
  return unembed(lnRows([x], w["ln_f.weight"], w["ln_f.bias"])[0], w);
}

export function prefill(promptIds: number[], w: Weights, mc: ModelCache): Float32Array {
  let X = promptIds.map((id, i) => embedToken(id, i, w));
  for (let layer = 0; layer < nLayer(w); layer++) X = prefillLayer(X, w, layer, mc.layers[layer]);
  return finalLogits(X[X.length - 1], w);
}

export function blockStep(x: Float32Array, w: Weights, layer: number, mc: ModelCache) {
  const p = `h.${layer}.`;
  const h = lnRows([x], w[p + "ln_1.weight"], w[p + "ln_1.bias"])[0];
  const cache = mc.layers[layer];
  x = addRows([x], [attnStep(h, w, layer, cache)])[0];
  return addRows([x], mlp(lnRows([x], w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer))[0];
}

export function decodeStep(tokenId: number, position: number, w: Weights, mc: ModelCache) {
  let x = embedToken(tokenId, position, w);
  for (let layer = 0; layer < nLayer(w); layer++) x = blockStep(x, w, layer, mc);
  return finalLogits(x, w);
}

export function decodeSequence(promptIds: number[], continuationIds: number[], w: Weights, mc: ModelCache): Rows {
  prefill(promptIds, w, mc);
  return continuationIds.map((tokenId, step) => decodeStep(tokenId, promptIds.length + step, w, mc));
}

function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

export function generate(promptIds: number[], maxNewTokens: number, w: Weights): number[] {
  if (promptIds.length + maxNewTokens > nCtx(w)) {
    throw new RangeError("prompt plus new tokens exceed the context");
  }
  const mc = freshCache(w);
  let logits = prefill(promptIds, w, mc);
  const out: number[] = [];
  for (let step = 0; step < maxNewTokens; step++) {
    out.push(argmax(logits));
    if (step + 1 < maxNewTokens) logits = decodeStep(out[out.length - 1], promptIds.length + step, w, mc);
  }
  return out;
}

function commonPrefix(a: number[], b: number[]): number {
  let n = 0;
  while (n < Math.min(a.length, b.length) && a[n] === b[n]) n++;
  return n;
}

function copyPrefix(mc: ModelCache, rows: number, heads: number): ModelCache {
  const out = new ModelCache(mc.layers.length, heads);
  mc.layers.forEach((src, l) => {
    out.layers[l].kData = src.kData.map((data) => data.slice(0, rows * HEAD_DIM));
    out.layers[l].vData = src.vData.map((data) => data.slice(0, rows * HEAD_DIM));
    out.layers[l].length = rows;
  });
  return out;
}

export class PrefixCache {
  w: Weights;
  entries: [number[], ModelCache][] = []; // prompt ids, and a cache holding all of its positions

  constructor(w: Weights) {
    this.w = w;
  }

  process(promptIds: number[]): [Float32Array, number] {
    const w = this.w;
    let best = 0;
    let source: ModelCache | null = null;
    for (const [ids, cached] of this.entries) {
      const n = commonPrefix(ids, promptIds);
      if (n > best) [best, source] = [n, cached];
    }
    const reused = Math.min(best, promptIds.length - 1);
    let mc: ModelCache;
    let logits: Float32Array;
    if (reused === 0) {
      mc = freshCache(w);
      logits = prefill(promptIds, w, mc);
    } else {
      mc = copyPrefix(source!, reused, nHead(w));
      logits = new Float32Array(0);
      for (let position = reused; position < promptIds.length; position++) {
        logits = decodeStep(promptIds[position], position, w, mc);
      }
    }
    this.entries.push([[...promptIds], mc]);
    return [logits, reused];
  }
}

export const plantable = [block, embed, recomputeLogits]; // used only by planted bugs
