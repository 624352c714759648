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
  if (finds.length / hd > 2 ** 29) return { applied: false, reason: "more rows than the index holds" };
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

// The rows to find, scaled to unit length and sorted by their first value: a row is compared
// only with the targets whose first value is within the pass's tolerance of its own. A
// target's number rides in the low 29 bits of its first value as a float64, which a float32
// value leaves zero: a native numeric sort keeps both, without an array per target.
class RowIndex {
  constructor(rows, hd) {
    this.hd = hd;
    this.count = rows.length / hd;
    this.units = new Float32Array(rows.length); // as the Python worker's: float32
    this.norms = new Float64Array(this.count);
    for (let t = 0; t < this.count; t++) this.norms[t] = unitInto(rows, t * hd, hd, this.units, t * hd);
    this.firsts = new Float64Array(this.count);
    const low = new Uint32Array(this.firsts.buffer); // little-endian: word 2t is value t's low half
    for (let t = 0; t < this.count; t++) {
      this.firsts[t] = this.units[t * hd];
      low[2 * t] |= t;
    }
    this.firsts.sort();
    this.low = low;
    this.row = new Float32Array(hd);
  }

  // {target, scale} for the row a[at .. at + hd], or null when it is no target's unambiguously
  match(a, at) {
    const norm = unitInto(a, at, this.hd, this.row, 0);
    if (!(norm > 0) || !Number.isFinite(norm)) return null;
    for (let p = 0; p < PASSES.length; p++) {
      const target = this.nearest(PASSES[p]);
      if (target !== null) return { target, scale: norm / this.norms[target] };
    }
    return null;
  }

  // the target within tol of the row, when every other one is farther by the ambiguity factor
  nearest(tol) {
    let best = null, bestErr = Infinity, runnerUp = Infinity;
    const v = this.row[0];
    for (let k = this.firstAtLeast(v - tol); k < this.count && this.firsts[k] <= v + tol; k++) {
      const t = this.low[2 * k] & 0x1fffffff, err = this.distance(t, tol);
      if (err > tol) continue;
      if (err < bestErr) {
        runnerUp = bestErr;
        bestErr = err;
        best = t;
      } else if (err < runnerUp) runnerUp = err;
    }
    return best !== null && runnerUp > SWAP.ambiguity * Math.max(bestErr, 1e-7) ? best : null;
  }

  firstAtLeast(value) {
    let lo = 0, hi = this.count;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.firsts[mid] < value) lo = mid + 1;
      else hi = mid;
    }
    return lo;
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
