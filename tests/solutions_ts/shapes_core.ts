// A correct KV cache written so that tests/ts_shapes.py can put it in many shapes: the prefill
// (fillCore) and the decode step (stepCore) are private functions, and `Heads`, one head's rows
// of one layer, is spliced in at the STORAGE line (a Float32Array, a DataView of float64 values, or
// plain numbers). Each shape adds the functions the adapters call.
import {
  HEAD_DIM, type Rows, type Weights, addRows, head, lnRows, matmul, matmulT, mlp, nHead, nLayer, qkv,
  softmax, unembed,
} from "./gpt2.ts";
export { NotImplementedError, embed, loadWeights } from "./gpt2.ts";

//STORAGE//

class LayerStore {
  k: Heads[];
  v: Heads[];
  constructor(h: number) {
    this.k = Array.from({ length: h }, () => new Heads());
    this.v = Array.from({ length: h }, () => new Heads());
  }
}
type Store = LayerStore[];

function newStore(w: Weights): Store {
  return Array.from({ length: nLayer(w) }, () => new LayerStore(nHead(w)));
}

function embedToken(id: number, pos: number, w: Weights): Float32Array {
  const d = w["wte.weight"].shape[1];
  const out = w["wte.weight"].data.slice(id * d, (id + 1) * d);
  const p = w["wpe.weight"].data.subarray(pos * d, (pos + 1) * d);
  for (let i = 0; i < d; i++) out[i] += p[i];
  return out;
}

function attendPrompt(q: Rows, k: Rows, v: Rows, heads: number): Rows {
  const a: Rows = q.map(() => new Float32Array(q[0].length));
  for (let h = 0; h < heads; h++) {
    const scores = matmulT(head(q, h), head(k, h));
    scores.forEach((s, t) => {
      for (let j = 0; j <= t; j++) s[j] /= Math.sqrt(HEAD_DIM);
      softmax(s, t + 1);
      s.fill(0, t + 1);
    });
    matmul(scores, head(v, h)).forEach((out, t) => a[t].set(out, h * HEAD_DIM));
  }
  return a;
}

function attendCached(q: Float32Array, L: LayerStore): Float32Array {
  const out = new Float32Array(q.length), n = L.k[0].length;
  for (let h = 0; h < L.k.length; h++) {
    const s = new Float32Array(n), K = L.k[h], V = L.v[h];
    for (let t = 0; t < n; t++) {
      let acc = 0;
      for (let j = 0; j < HEAD_DIM; j++) acc += q[h * HEAD_DIM + j] * K.get(t, j);
      s[t] = acc / Math.sqrt(HEAD_DIM);
    }
    softmax(s, n);
    for (let t = 0; t < n; t++) {
      for (let j = 0; j < HEAD_DIM; j++) out[h * HEAD_DIM + j] += s[t] * V.get(t, j);
    }
  }
  return out;
}

function finalLogits(x: Float32Array, w: Weights) {
  return unembed(lnRows([x], w["ln_f.weight"], w["ln_f.bias"])[0], w);
}

function keep(store: Store, l: number, k: Rows, v: Rows, w: Weights) {
  for (let h = 0; h < nHead(w); h++) {
    store[l].k[h].push(head(k, h));
    store[l].v[h].push(head(v, h));
  }
}

function fillCore(ids: number[], w: Weights, store: Store): Float32Array {
  let X = ids.map((id, i) => embedToken(id, i, w));
  for (let l = 0; l < nLayer(w); l++) {
    const p = `h.${l}.`;
    const [q, k, v] = qkv(lnRows(X, w[p + "ln_1.weight"], w[p + "ln_1.bias"]), w, l);
    keep(store, l, k, v, w);
    const a = attendPrompt(q, k, v, nHead(w));
    X = addRows(X, matmul(a, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]));
    X = addRows(X, mlp(lnRows(X, w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, l));
  }
  return finalLogits(X[X.length - 1], w);
}

function stepCore(id: number, pos: number, w: Weights, store: Store): Float32Array {
  let x = embedToken(id, pos, w);
  for (let l = 0; l < nLayer(w); l++) {
    const p = `h.${l}.`;
    const [q, k, v] = qkv(lnRows([x], w[p + "ln_1.weight"], w[p + "ln_1.bias"]), w, l);
    keep(store, l, k, v, w);
    const a = attendCached(q[0], store[l]);
    x = addRows([x], matmul([a], w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]))[0];
    x = addRows([x], mlp(lnRows([x], w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, l))[0];
  }
  return finalLogits(x, w);
}
