"""Correct TypeScript caches in shapes the course's template does not have, and forgeries in
them: tests/solutions_ts/shapes_core.ts with its rows' storage and the functions its adapters
call. tests/test_typescript.py grades their swap proofs."""

from pathlib import Path

CORE = (Path(__file__).parent / "solutions_ts" / "shapes_core.ts").read_text()

# one head's rows of one layer: grown by doubling, or one value at a time
STORAGE = {
    "float32": """
class Heads {
  data = new Float32Array(0);
  length = 0;
  push(rows: Float32Array[]) {
    const need = (this.length + rows.length) * HEAD_DIM;
    if (need > this.data.length) {
      const grown = new Float32Array(2 * need);
      grown.set(this.data.subarray(0, this.length * HEAD_DIM));
      this.data = grown;
    }
    rows.forEach((r, i) => this.data.set(r, (this.length + i) * HEAD_DIM));
    this.length += rows.length;
  }
  get(t: number, j: number) { return this.data[t * HEAD_DIM + j]; }
}""",
    "dataview64": """
class Heads {
  view = new DataView(new ArrayBuffer(0));
  length = 0;
  push(rows: Float32Array[]) {
    const need = (this.length + rows.length) * HEAD_DIM * 8;
    if (need > this.view.byteLength) {
      const grown = new ArrayBuffer(2 * need);
      new Uint8Array(grown).set(new Uint8Array(this.view.buffer, 0, this.length * HEAD_DIM * 8));
      this.view = new DataView(grown);
    }
    rows.forEach((r, i) => r.forEach((x, j) =>
      this.view.setFloat64(((this.length + i) * HEAD_DIM + j) * 8, x, true)));
    this.length += rows.length;
  }
  get(t: number, j: number) { return this.view.getFloat64((t * HEAD_DIM + j) * 8, true); }
}""",
    "numbers": """
class Heads {
  data: number[] = [];
  length = 0;
  push(rows: Float32Array[]) {
    for (const r of rows) this.data.push(...r);
    this.length += rows.length;
  }
  get(t: number, j: number) { return this.data[t * HEAD_DIM + j]; }
}""",
}

# shape -> (what src/kvcache.ts adds, tests/adapters.ts); `run(p, n)` and `runs(p, c)` are
# wired to runDecodeStep and runDecodeSequence by ADAPTERS
SHAPES = {
    "a generator that prefills, then yields each step": ("""
export function* decodeAll(p: number[], c: number[], w: Weights) {
  const s = newStore(w);
  fillCore(p, w, s);
  for (let i = 0; i < c.length; i++) yield stepCore(c[i], p.length + i, w, s);
}""", """import { decodeAll, loadWeights } from "../src/kvcache.ts";
const run = async (p: number[], n: number) =>
  decodeAll(p, [n], await loadWeights()).next().value;
const runs = async (p: number[], c: number[]) => [...decodeAll(p, c, await loadWeights())];"""),
    "a private class returned by a factory": ("""
class Hidden {
  store: Store;
  constructor(public w: Weights) { this.store = newStore(w); }
  fill(ids: number[]) { fillCore(ids, this.w, this.store); }
  step(id: number, pos: number) { return stepCore(id, pos, this.w, this.store); }
}
export function open(w: Weights) { return new Hidden(w); }""",
     """import { open, loadWeights } from "../src/kvcache.ts";
const begun = async (p: number[]) => { const h = open(await loadWeights()); h.fill(p); return h; };
const run = async (p: number[], n: number) => (await begun(p)).step(n, p.length);
const runs = async (p: number[], c: number[]) => {
  const h = await begun(p);
  return c.map((id, i) => h.step(id, p.length + i));
};"""),
    "one function that prefills and decodes": ("""
export function decodeAfter(p: number[], c: number[], w: Weights) {
  const s = newStore(w);
  fillCore(p, w, s);
  return c.map((id, i) => stepCore(id, p.length + i, w, s));
}""", """import { decodeAfter, loadWeights } from "../src/kvcache.ts";
const run = async (p: number[], n: number) => decodeAfter(p, [n], await loadWeights())[0];
const runs = async (p: number[], c: number[]) => decodeAfter(p, c, await loadWeights());"""),
    "a cache at module level, prefilled by another name": ("""
export const kept: { store: Store | null } = { store: null };
export function begin(ids: number[], w: Weights) {
  kept.store = newStore(w);
  fillCore(ids, w, kept.store);
}
export function next(id: number, pos: number, w: Weights) {
  return stepCore(id, pos, w, kept.store!);
}""",
     """import { begin, next, loadWeights } from "../src/kvcache.ts";
const run = async (p: number[], n: number) => {
  const w = await loadWeights();
  begin(p, w);
  return next(n, p.length, w);
};
const runs = async (p: number[], c: number[]) => {
  const w = await loadWeights();
  begin(p, w);
  return c.map((id, i) => next(id, p.length + i, w));
};"""),
    "an async prefill by another name": ("""
export async function warm(ids: number[], w: Weights, s: Store) {
  await null;
  return fillCore(ids, w, s);
}
export const fresh = (w: Weights) => newStore(w);
export const step = (id: number, pos: number, w: Weights, s: Store) => stepCore(id, pos, w, s);""",
     """import { fresh, loadWeights, step, warm } from "../src/kvcache.ts";
const begun = async (p: number[]) => {
  const w = await loadWeights(), s = fresh(w);
  await warm(p, w, s);
  return [w, s] as const;
};
const run = async (p: number[], n: number) => {
  const [w, s] = await begun(p);
  return step(n, p.length, w, s);
};
const runs = async (p: number[], c: number[]) => {
  const [w, s] = await begun(p);
  return c.map((id, i) => step(id, p.length + i, w, s));
};"""),
}

# a decode that recomputes from the prompt's ids it kept, in a class's methods, beside the
# cache its prefill fills
FORGERY = ("""
export class Model {
  ids: number[] = [];
  store: Store;
  constructor(public w: Weights) { this.store = newStore(w); }
  ingest(ids: number[]) { this.ids = [...ids]; return fillCore(ids, this.w, this.store); }
  step(id: number, pos: number) {
    const s = newStore(this.w);
    fillCore(this.ids, this.w, s);
    this.ids.push(id);
    return stepCore(id, pos, this.w, s);
  }
}""", """import { Model, loadWeights } from "../src/kvcache.ts";
const begun = async (p: number[]) => {
  const m = new Model(await loadWeights());
  m.ingest(p);
  return m;
};
const run = async (p: number[], n: number) => (await begun(p)).step(n, p.length);
const runs = async (p: number[], c: number[]) => {
  const m = await begun(p);
  return c.map((id, i) => m.step(id, p.length + i));
};""")

ADAPTERS = """
export const runDecodeStep = run;
export const runDecodeSequence = runs;
"""


def course_texts(shape: tuple[str, str], storage: str = "float32") -> tuple[str, str]:
    """(src/kvcache.ts, tests/adapters.ts) of a shape, its rows kept in `storage`."""
    added, adapters = shape
    return CORE.replace("//STORAGE//", STORAGE[storage]) + added, adapters + ADAPTERS
