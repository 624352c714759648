// The cache-use swap inside the Node worker (the Python worker's swap.py and cache_rows.py, by
// the same rule): the K/V the grader sends are found by content in the student's typed arrays
// and overwritten in place.
//
// Every Float32Array/Float64Array reachable from the cache whose length is a multiple of the
// head size is read as rows of head_dim consecutive values (one row of one head, one position's
// heads, one head's rows, a whole layer as [heads, N, headDim] or [N, heads * headDim]: all are
// rows). A row is a target's when, both scaled to unit length, no value differs by more than
// protocol.json's tolerance and every other target is farther by its ambiguity factor (a first
// pass at its first_pass tolerance, then the whole tolerance for the rows left): keys kept
// pre-scaled are found too, and written at their scale. Only when every row of every layer's
// K and V is found is anything written.

import { PROTOCOL } from "./worker_node_protocol.mjs";

const SWAP = PROTOCOL.swap;
const PASSES = [SWAP.first_pass, SWAP.tolerance];

export function swapCache(roots, plan, blobs) {
  const [layers, h, hd, n] = SWAP.plan.map((key) => Number(plan[key]));
  const [finds, writes] = planned(blobs, layers, h * n * hd); // [2 * layers * h * n * hd] each
  const targets = new RowIndex(finds, hd);
  const arrays = floatArrays(roots);
  const covered = new Uint8Array(targets.count), places = [];
  for (const a of arrays) {
    if (a.length % hd !== 0) continue;
    for (let at = 0; at < a.length; at += hd) {
      const hit = targets.match(a, at);
      if (hit === null) continue;
      places.push({ a, at, ...hit });
      covered[hit.target] = 1;
    }
  }
  const missing = covered.indexOf(0);
  if (missing >= 0) return { applied: false, reason: missingReason(covered, missing, h * n, hd, arrays.length) };
  for (const { a, at, target, scale } of places) {
    for (let j = 0; j < hd; j++) a[at + j] = scale * writes[target * hd + j];
  }
  return { applied: true, reason: "", places: new Set(places.map((p) => p.a)).size }; // arrays written
}

// Every layer's K and V to find, and to write, each one array in the order K, V by layer:
// the plan's blobs are, per layer, in protocol.json's blob order
function planned(blobs, layers, size) {
  const order = SWAP.blob_order;
  const finds = new Float32Array(2 * layers * size), writes = new Float32Array(2 * layers * size);
  for (let l = 0; l < layers; l++) {
    for (const [kv, which] of ["k", "v"].entries()) {
      const at = (2 * l + kv) * size;
      finds.set(blobs[order.length * l + order.indexOf(`find_${which}`)], at);
      writes.set(blobs[order.length * l + order.indexOf(`write_${which}`)], at);
    }
  }
  return [finds, writes];
}

function missingReason(covered, missing, rows, hd, arrays) {
  const tensor = Math.floor(missing / rows);
  let found = 0;
  for (let r = tensor * rows; r < (tensor + 1) * rows; r++) found += covered[r];
  return `layer ${tensor >> 1}'s ${"KV"[tensor & 1]} (${found} of ${rows} of its rows of ${hd} ` +
    `values, one per head and position, found) was not found among ${arrays} arrays reachable from the cache`;
}

// The rows to find, scaled to unit length and hashed, per pass, on a grid of their first three
// values (cells twice the pass's tolerance): a row is compared only with the few targets it
// could be
class RowIndex {
  constructor(rows, hd) {
    this.hd = hd;
    this.count = rows.length / hd;
    this.units = new Float64Array(rows.length);
    this.norms = new Float64Array(this.count);
    for (let t = 0; t < this.count; t++) this.norms[t] = unitInto(rows, t * hd, hd, this.units, t * hd);
    this.grids = PASSES.map((tol) => grid(this.units, this.count, hd, 2 * tol));
    this.row = new Float64Array(hd);
  }

  // {target, scale} for the row a[at .. at + hd], or null when it is no target's unambiguously
  match(a, at) {
    const norm = unitInto(a, at, this.hd, this.row, 0);
    if (!(norm > 0) || !Number.isFinite(norm)) return null;
    for (const [p, tol] of PASSES.entries()) {
      const target = this.nearest(this.grids[p], 2 * tol, tol);
      if (target !== null) return { target, scale: norm / this.norms[target] };
    }
    return null;
  }

  nearest(cells, size, tol) {
    let best = null, bestErr = Infinity, runnerUp = Infinity;
    for (const key of around(this.row, size)) {
      for (const t of cells.get(key) ?? []) {
        const err = this.distance(t, tol);
        if (err > tol) continue;
        if (err < bestErr) [runnerUp, bestErr, best] = [bestErr, err, t];
        else if (err < runnerUp) runnerUp = err;
      }
    }
    return best !== null && runnerUp > SWAP.ambiguity * Math.max(bestErr, 1e-7) ? best : null;
  }

  // max |difference| between the row and target t, once past `stop` only known to be past it
  distance(t, stop) {
    let err = 0;
    for (let j = 0, at = t * this.hd; j < this.hd && err <= stop; j++) {
      err = Math.max(err, Math.abs(this.row[j] - this.units[at + j]));
    }
    return err;
  }
}

// The row's values divided by its length, written to out[to ..]; its length
function unitInto(a, at, hd, out, to) {
  let sum = 0;
  for (let j = 0; j < hd; j++) sum += a[at + j] * a[at + j];
  const norm = Math.sqrt(sum), scale = 1 / Math.max(norm, 1e-30);
  for (let j = 0; j < hd; j++) out[to + j] = a[at + j] * scale;
  return norm;
}

// cell indices within +-2**16 (a unit row's values are within +-1), three in one number that a
// float64 holds exactly
const OFFSET = 2 ** 16, SPAN = 2 ** 17;

function cellKey(x, y, z) {
  const c = (v) => Math.min(Math.max(v, -OFFSET), OFFSET - 1) + OFFSET;
  return (c(x) * SPAN + c(y)) * SPAN + c(z);
}

function grid(units, count, hd, size) {
  const cells = new Map();
  for (let t = 0; t < count; t++) {
    const at = t * hd;
    const key = cellKey(...[0, 1, 2].map((j) => Math.floor(units[at + j] / size)));
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(t);
  }
  return cells;
}

// The 8 cells around the corner of the row's cell nearest it: any target within half a cell
// of the row, in each of its first three values, is in one of them
function* around(row, size) {
  const scaled = [0, 1, 2].map((j) => row[j] / size);
  const base = scaled.map(Math.floor);
  const toward = scaled.map((s, j) => (s - base[j] < 0.5 ? -1 : 1));
  for (let step = 0; step < 8; step++) {
    yield cellKey(...base.map((b, j) => b + ((step >> j) & 1) * toward[j]));
  }
}

// Every float array reachable from the roots: through arrays, Maps, Sets and objects, at any
// depth (a linked list of nodes included), each once
function floatArrays(roots) {
  const seen = new Set(), found = [], stack = [...roots];
  while (stack.length) {
    const obj = stack.pop();
    if (obj === null || typeof obj !== "object" || seen.has(obj)) continue;
    seen.add(obj);
    if (obj instanceof Float32Array || obj instanceof Float64Array) found.push(obj);
    else if (obj instanceof Map || obj instanceof Set) pushObjects(stack, obj.values());
    else if (!ArrayBuffer.isView(obj)) pushObjects(stack, Object.values(obj));
  }
  return found.reverse();
}

function pushObjects(stack, values) {
  for (const v of values) if (v !== null && typeof v === "object") stack.push(v);
}
