// The functions the grader calls, one per check. Wire them to your src/kvcache.ts.
//
// Each receives plain arrays of token ids (copies: changing them changes nothing) and returns
// arrays (Float32Array, number[] or arrays of rows), directly or as a Promise. Throwing
// NotImplementedError means "not started yet".

import { embed } from "../src/gpt2.ts";
import {
  ModelCache,
  PrefixCache,
  decodeSequence,
  decodeStep,
  freshCache,
  generate,
  layerAttnIncremental,
  loadWeights,
  prefill,
} from "../src/kvcache.ts";

// single-step-attention: layer 0's attention-sublayer output at the last position, [d].
export async function runStepAttention(seqIds: number[]): Promise<Float32Array> {
  const w = await loadWeights(); // $THEINFERENCE_WEIGHTS, read once
  const out = layerAttnIncremental(embed(seqIds, w), w, 0);
  return out[out.length - 1]!;
}

// build-prefill: the last prompt position's next-token logits, [vocab].
export async function runPrefill(promptIds: number[]): Promise<Float32Array> {
  const w = await loadWeights();
  return prefill(promptIds, w, freshCache(w));
}

// build-prefill: what prefill leaves behind, one [k, v] per layer, each
// [nHead, promptIds.length, HEAD_DIM].
export async function runPrefillCache(promptIds: number[]) {
  const w = await loadWeights();
  const mc: ModelCache = freshCache(w);
  prefill(promptIds, w, mc);
  return mc.layers.map((layer) => [layer.k, layer.v]);
}

// full-decode-step: prefill the prompt, decode nextId at position promptIds.length, return
// its next-token logits, [vocab].
export async function runDecodeStep(promptIds: number[], nextId: number): Promise<Float32Array> {
  const w = await loadWeights();
  const mc = freshCache(w);
  prefill(promptIds, w, mc); // populate every layer's cache
  return decodeStep(nextId, promptIds.length, w, mc); // decode at position promptIds.length
}

// per-step-identity: prefill, then decode each continuation token at positions
// promptIds.length, promptIds.length + 1, ...; one logits row per step, [steps, vocab].
export async function runDecodeSequence(promptIds: number[], continuationIds: number[]) {
  const w = await loadWeights();
  return decodeSequence(promptIds, continuationIds, w, freshCache(w));
}

// generate-loop: the greedy new token ids, exactly maxNewTokens of them.
export async function runGenerate(promptIds: number[], maxNewTokens: number): Promise<number[]> {
  return generate(promptIds, maxNewTokens, await loadWeights());
}

// prefix-caching: the prompts in order through ONE PrefixCache; a [logits, reused] pair for each.
export async function runPrefixCaching(prompts: number[][]) {
  const cache = new PrefixCache(await loadWeights());
  return prompts.map((prompt) => cache.process(prompt));
}
