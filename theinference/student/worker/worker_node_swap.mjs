// The cache-use swap inside the Node worker (the Python worker's swap.py, by the same rule):
// all float memory reachable from the cache is sent to the grader, which finds the prompt's K/V
// in it by content (they never come here) and answers with the rows to overwrite, in place,
// and their new values; or with why it found no cache. Whether the swap happened is the
// grader's to judge, by the answer alone. Float memory: Float32Array and Float64Array, Int32Array
// and Uint32Array by their bits, ArrayBuffer and SharedArrayBuffer read as float32, DataView
// read as float32 in either byte order (its methods' default is big-endian), and plain arrays of
// numbers (a copy, as for a DataView: put back once written, and only then).
//
// The grader reads each array as rows of head_dim consecutive values (one row of one head, one
// position's heads, one head's rows, a whole layer as [heads, N, headDim] or [N, heads *
// headDim]: all are rows); keys kept pre-scaled are written at their scale.

import { PROTOCOL } from "./worker_node_protocol.mjs";

const SWAP = PROTOCOL.swap;
const DTYPES = PROTOCOL.values.typed_arrays;

// exchange(header, blobs) -> [answer, blobs]: the hook's word to the grader and its answer
export function swapCache(roots, plan, exchange) {
  const [layers, h, hd, n] = SWAP.plan.map((key) => Number(plan[key]));
  const needed = 2 * layers * h * n * hd; // every layer's K and V: the least held
  const memories = floatMemories(roots, hd), arrays = memories.map((m) => m.array);
  const held = arrays.reduce((sum, a) => sum + a.length, 0);
  if (held < needed) {
    return { applied: false, reason: `${held} values found, fewer than the ${needed} of every layer's K and V, among ${arrays.length} arrays reachable from the cache` };
  }
  const about = `${arrays.length} float arrays reachable from the cache`;
  const sent = arrays.map((a, blob) => ({ dtype: DTYPES[a.constructor.name], shape: [a.length], blob, bf16: false }));
  const blobs = arrays.map((a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength));
  const [answer, back] = exchange({ outcome: "hooked", probe: { held: sent, about } }, blobs);
  if (!Array.isArray(answer?.write)) {
    return { applied: false, reason: String(answer?.reason ?? "the grader found no cache") };
  }
  for (const w of answer.write) {
    const a = arrays[w.held], rows = new BigInt64Array(back[w.rows]), values = new Float32Array(back[w.values]);
    for (let r = 0; r < rows.length; r++) {
      const at = Number(rows[r]) * hd;
      for (let j = 0; j < hd; j++) a[at + j] = values[r * hd + j];
    }
  }
  // a copy written is put back where its values live; one not written is left alone (its
  // other reading of the same bytes, a NaN among them, must not rewrite them)
  const written = new Set(answer.write.map((w) => w.held));
  memories.forEach((m, held) => { if (m.commit && written.has(held)) m.commit(); });
  return { applied: true, reason: "", places: answer.write.length };
}

// All float memory reachable from the roots ({array} sharing it, or {array, list}: a copy of
// a plain array of numbers): through arrays, Maps (keys and values), Sets and objects, at any
// depth (a linked list of nodes included), each once
function floatMemories(roots, hd) {
  const seen = new Set(), found = [], stack = [...roots];
  while (stack.length) {
    const obj = stack.pop();
    if (obj === null || typeof obj !== "object" || seen.has(obj)) continue;
    seen.add(obj);
    try { // an object that throws when read (a getter, a proxy) is passed over, not the search
      const memory = obj instanceof DataView ? dataViewMemories(obj) : floatMemory(obj, hd);
      if (memory) found.push(...[memory].flat());
      else if (obj instanceof Map) pushObjects(stack, [...obj.keys(), ...obj.values()]);
      else if (obj instanceof Set) pushObjects(stack, obj.values());
      else if (!ArrayBuffer.isView(obj) && !isBuffer(obj)) pushObjects(stack, Object.values(obj));
    } catch {
      continue;
    }
  }
  return found.reverse();
}

function floatMemory(obj, hd) {
  if (obj instanceof Float32Array || obj instanceof Float64Array) return { array: obj };
  if (obj instanceof Int32Array || obj instanceof Uint32Array) { // float32 bits kept as integers
    return { array: new Float32Array(obj.buffer, obj.byteOffset, obj.length) };
  }
  if (isBuffer(obj)) return obj.byteLength % 4 === 0 ? { array: new Float32Array(obj) } : null;
  if (Array.isArray(obj) && obj.length >= hd && obj.length % hd === 0 && obj.every((x) => typeof x === "number")) {
    const array = Float64Array.from(obj);
    return { array, commit: () => array.forEach((x, i) => { obj[i] = x; }) };
  }
  return null;
}

// A DataView's float32 values read both ways, little- and big-endian (getFloat32's default),
// each a copy put back in its own byte order: the grader finds the rows in the one that holds them
function dataViewMemories(view) {
  const count = Math.floor(view.byteLength / 4);
  return [true, false].map((little) => {
    const array = Float32Array.from({ length: count }, (_, i) => view.getFloat32(4 * i, little));
    return { array, commit: () => array.forEach((x, i) => view.setFloat32(4 * i, x, little)) };
  });
}

function isBuffer(obj) {
  return obj instanceof ArrayBuffer || (typeof SharedArrayBuffer !== "undefined" && obj instanceof SharedArrayBuffer);
}

function pushObjects(stack, values) {
  for (const v of values) if (v !== null && typeof v === "object") stack.push(v);
}
