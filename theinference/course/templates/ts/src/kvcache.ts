// Your KV cache for GPT-2. Each stub throws NotImplementedError until you write it.
//
// Grade a stage with `theinference test --stage <slug> --watch` from the course directory (the
// grader is a Python command, not an npm package); `npx tsc --noEmit` type-checks your files.
// Only attention changes from src/gpt2.ts: reuse lnRows, qkv, mlp, unembed and embed as they are
// (matmul, matmulT and head do the heavy products fast, if you want them for attention; they
// take rows, or one [rows, HEAD_DIM] array as a Tensor, which they copy in one piece).

import {
  HEAD_DIM,
  NotImplementedError,
  type Rows,
  type Weights,
  nHead,
  nLayer,
} from "./gpt2.ts";

export {
  HEAD_DIM,
  NotImplementedError,
  dot,
  embed,
  head,
  lnRows,
  loadWeights,
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
export type { Rows, Tensor, Weights } from "./gpt2.ts";

// One layer's K/V history: k[head][position] and v[head][position] are HEAD_DIM-long rows,
// so k and v are [nHead, length, HEAD_DIM].
export class LayerCache {
  k: Float32Array[][];
  v: Float32Array[][];

  constructor(heads = 12) {
    this.k = Array.from({ length: heads }, () => []);
    this.v = Array.from({ length: heads }, () => []);
  }

  get length(): number {
    return this.k[0].length;
  }
}

// One LayerCache per layer: layer l reads and grows mc.layers[l] only.
export class ModelCache {
  layers: LayerCache[];

  constructor(layers = 12, heads = 12) {
    this.layers = Array.from({ length: layers }, () => new LayerCache(heads));
  }
}

export function freshCache(w: Weights): ModelCache {
  return new ModelCache(nLayer(w), nHead(w));
}

// --- stage single-step-attention ------------------------------------------------------------

// [d] ln_1 output of ONE new token -> [d] attention contribution a (no residual).
// Project through qkv, append the new K/V to the cache, then per head attend the new Q over
// every cached row (the new one included), scale 1/sqrt(64), softmax, weight V, merge the heads
// and apply attn.c_proj.
export function attnStep(
  lnHidden: Float32Array,
  w: Weights,
  layer: number,
  cache: LayerCache,
): Float32Array {
  throw new NotImplementedError("single-step-attention: implement attnStep in src/kvcache.ts");
}

// [n, d] layer inputs -> [n, d] attention-sublayer outputs (X[t] + a), one token at a time
// through a fresh LayerCache.
export function layerAttnIncremental(X: Rows, w: Weights, layer: number): Rows {
  throw new NotImplementedError(
    "single-step-attention: implement layerAttnIncremental in src/kvcache.ts",
  );
}

// --- stage build-prefill --------------------------------------------------------------------

// [d]: wte[tokenId] + wpe[position], position being the token's ABSOLUTE index.
export function embedToken(tokenId: number, position: number, w: Weights): Float32Array {
  throw new NotImplementedError("build-prefill: implement embedToken in src/kvcache.ts");
}

// Run the prompt through every layer under the causal mask, leave exactly promptIds.length rows
// in every layer's cache, and return the last position's [vocab] logits.
export function prefill(promptIds: number[], w: Weights, mc: ModelCache): Float32Array {
  throw new NotImplementedError("build-prefill: implement prefill in src/kvcache.ts");
}

// --- stage full-decode-step -----------------------------------------------------------------

// [d] -> [d]: ln_1 -> attnStep (reads and grows mc.layers[layer]) -> ln_2 -> mlp.
export function blockStep(x: Float32Array, w: Weights, layer: number, mc: ModelCache): Float32Array {
  throw new NotImplementedError("full-decode-step: implement blockStep in src/kvcache.ts");
}

// One new token at absolute `position` through every layer, then ln_f and the tied unembed:
// [vocab] next-token logits.
export function decodeStep(
  tokenId: number,
  position: number,
  w: Weights,
  mc: ModelCache,
): Float32Array {
  throw new NotImplementedError("full-decode-step: implement decodeStep in src/kvcache.ts");
}

// --- stage per-step-identity ----------------------------------------------------------------

// Prefill the prompt into mc, then decode each continuation token in turn at positions
// promptIds.length, promptIds.length + 1, ...: [continuationIds.length, vocab], one row per step.
export function decodeSequence(
  promptIds: number[],
  continuationIds: number[],
  w: Weights,
  mc: ModelCache,
): Rows {
  throw new NotImplementedError("per-step-identity: implement decodeSequence in src/kvcache.ts");
}

// --- stage generate-loop --------------------------------------------------------------------

// Greedy generation through the cache: exactly maxNewTokens new ids (not the prompt).
// Throw a RangeError when promptIds.length + maxNewTokens exceeds the context (nCtx(w) = 1024
// positions): there is no position to put them at. Check it first, before prefill: a guard met
// later, deep in the decode, refuses too late.
export function generate(promptIds: number[], maxNewTokens: number, w: Weights): number[] {
  throw new NotImplementedError("generate-loop: implement generate in src/kvcache.ts");
}

// --- stage prefix-caching -------------------------------------------------------------------

// Keeps the K/V of prompts already processed, so a new prompt that shares a prefix with any
// earlier one computes only what is new.
export class PrefixCache {
  w: Weights;

  constructor(w: Weights) {
    this.w = w;
  }

  // -> [[vocab] logits of the prompt's last position, positions reused from the cache].
  // Reuse min(longest common prefix with any earlier prompt, promptIds.length - 1) positions,
  // on a COPY of those rows; compute the rest at positions reused, reused + 1, ...
  process(promptIds: number[]): [Float32Array, number] {
    throw new NotImplementedError("prefix-caching: implement PrefixCache.process in src/kvcache.ts");
  }
}
