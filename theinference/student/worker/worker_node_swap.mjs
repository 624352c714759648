// The cache-use swap inside the Node worker (the Python worker's swap.py, by the same rule):
// all float memory reachable from the cache is sent to the grader, which finds the prompt's K/V
// in it by content (they never come here) and answers with the rows to overwrite, in place,
// and their new values; or with why it found no cache. Whether the swap happened is the
// grader's to judge, by the answer alone. Float memory: Float32Array and Float64Array, Int32Array
// and Uint32Array by their bits, ArrayBuffer and SharedArrayBuffer read as float32, DataView
// read as float32 and as float64 in either byte order (its methods' default is big-endian), and
// plain arrays of numbers (a copy, as for a DataView: put back once written, and only then).
//
// The grader reads each array as rows of head_dim consecutive values (one row of one head, one
// position's heads, one head's rows, a whole layer as [heads, N, headDim] or [N, heads *
// headDim]: all are rows); keys kept pre-scaled are written at their scale.

import fs from "node:fs";
import { PROTOCOL } from "./worker_node_protocol.mjs";

const SWAP = PROTOCOL.swap;
const DTYPES = PROTOCOL.values.typed_arrays;

// The swap of one call: at each moment it is asked, what the roots reach is sent, once its
// rows that are not all zeros could hold every layer's K and V (a cache filled row by row is
// not sent half built) and it changed since it was last sent; never the weights (nor an array
// sharing their memory: the provided kernel's heap), all-zero arrays, or one the grader found
// no row in and unchanged since. The rows the grader answers with are written.
// exchange(header, blobs) -> [answer, blobs]: a word to the grader and its answer
export class Target {
  constructor(plan, exchange) {
    const [layers, h, hd, n] = SWAP.plan.map((key) => Number(plan[key]));
    this.hd = hd;
    this.needed = 2 * layers * h * n * hd; // every layer's K and V: the least held
    this.exchange = exchange;
    this.barren = new WeakMap(); // source -> reading -> checksum of its bytes when no row was in it
    this.lastSent = ""; // the checksums of what was sent last
  }

  swap(roots) {
    const memories = withoutWeights(floatMemories(roots, this.hd).filter((m) => holdsRows(m.array, this.hd)));
    const about = `${memories.length} float arrays reachable from the cache`;
    let fresh = [];
    if (memories.reduce((sum, m) => sum + m.array.length, 0) >= this.needed) fresh = this.unseen(memories);
    const held = fresh.reduce((sum, m) => sum + m.rows * this.hd, 0);
    if (held < this.needed) {
      return { applied: false, reason: `${held} values found in rows not all zeros (besides arrays found to hold no K/V before), fewer than the ${this.needed} of every layer's K and V, among ${about}` };
    }
    const sending = fresh.map((m) => m.digest).join(" ");
    if (sending === this.lastSent) return { applied: false, reason: "unchanged since the grader last looked" };
    this.lastSent = sending;
    return this.send(fresh, about);
  }

  send(fresh, about) {
    const arrays = fresh.map((m) => m.array);
    const sent = arrays.map((a, blob) => ({ dtype: DTYPES[a.constructor.name], shape: [a.length], blob, bf16: false }));
    const blobs = arrays.map((a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength));
    const [answer, back] = this.exchange({ outcome: "hooked", probe: { held: sent, about } }, blobs);
    for (const i of Array.isArray(answer?.barren) ? answer.barren : []) {
      if (Number.isInteger(i) && fresh[i]) this.markBarren(fresh[i], fresh[i].digest);
    }
    if (!Array.isArray(answer?.write)) {
      return { applied: false, reason: String(answer?.reason ?? "the grader found no cache"), stop: answer?.stop === true };
    }
    writeRows(arrays, answer.write, back, this.hd);
    // a copy written is put back where its values live; one not written is left alone (its
    // other reading of the same bytes, a NaN among them, must not rewrite them)
    const written = new Set(answer.write.map((w) => w.held));
    fresh.forEach((m, held) => { if (m.commit && written.has(held)) m.commit(); });
    return { applied: true, reason: "", places: answer.write.length };
  }

  // the memories that may hold a row the grader has not looked at, with their rows that are
  // not all zeros: not found barren before and unchanged since, and not all zeros (a cache
  // allocated before its prefill)
  unseen(memories) {
    const fresh = [];
    for (const m of memories) {
      const { digest, rows } = survey(m.array, this.hd);
      if (this.barren.get(m.source)?.get(m.tag ?? "") === digest) continue;
      if (rows === 0) { this.markBarren(m, digest); continue; }
      fresh.push({ ...m, digest, rows });
    }
    return fresh;
  }

  markBarren(memory, digest) {
    if (!this.barren.has(memory.source)) this.barren.set(memory.source, new Map());
    this.barren.get(memory.source).set(memory.tag ?? "", digest);
  }
}

export function swapCache(roots, plan, exchange) {
  return new Target(plan, exchange).swap(roots);
}

function writeRows(arrays, writes, back, hd) {
  for (const w of writes) {
    const a = arrays[w.held], rows = new BigInt64Array(back[w.rows]), values = new Float32Array(back[w.values]);
    for (let r = 0; r < rows.length; r++) {
      const at = Number(rows[r]) * hd;
      for (let j = 0; j < hd; j++) a[at + j] = values[r * hd + j];
    }
  }
}

// the grader reads an array of length N as rows when N is a multiple of head_dim
function holdsRows(a, hd) {
  return a.length >= hd && a.length % hd === 0;
}

// A checksum of an array, and how many of its rows of hd values are not zeros: both read from
// the first two values of each row alone, so that a moment costs a read of the cache's rows,
// not of all its values (a K/V row written changes its first values; one whose first two are
// both exactly zero has no direction the grader's search could match, either)
function survey(a, hd) {
  const words = new Int32Array(a.buffer, a.byteOffset, a.byteLength / 4);
  const perRow = hd * (a.BYTES_PER_ELEMENT / 4), read = Math.min(perRow, 2 * (a.BYTES_PER_ELEMENT / 4));
  let h = 0x811c9dc5 | 0, rows = 0;
  for (let start = 0; start < words.length; start += perRow) {
    let any = 0;
    for (let i = start; i < start + read; i++) {
      any |= words[i];
      h = Math.imul(h ^ words[i], 16777619);
    }
    if (any !== 0) rows++;
  }
  return { digest: `${words.length}:${h}`, rows };
}

// The weights, known by their length and first values (the safetensors file the worker was
// given, $THEINFERENCE_WEIGHTS): never sent nor written, whether views of the file's bytes or
// copies (a Float64Array of them included)
const SIGNED = SWAP.weights_signed; // arrays this long are compared with the weights' first values
const FIRSTS = 4;
let signatures = null;

const weightMemory = new WeakSet(); // the buffers weights were found in

// the memories but the weights and what shares their buffer (the provided kernel's heap)
function withoutWeights(memories) {
  for (const m of memories) if (isWeight(m.array)) weightMemory.add(m.array.buffer);
  return memories.filter((m) => !weightMemory.has(m.array.buffer));
}

const knownWeights = new WeakMap(); // an array -> whether it is a weight (its values never change)

function isWeight(a) {
  if (a.length < SIGNED) return false;
  if (!knownWeights.has(a)) knownWeights.set(a, signedWeight(a));
  return knownWeights.get(a);
}

function signedWeight(a) {
  signatures ??= weightSignatures(process.env.THEINFERENCE_WEIGHTS);
  const firsts = signatures.get(a.length);
  return firsts !== undefined && firsts.has(firstValues(a));
}

function firstValues(a) {
  return Array.from({ length: FIRSTS }, (_, i) => Math.fround(a[i])).join(",");
}

function weightSignatures(file) {
  const found = new Map();
  if (!file) return found;
  let fd = -1;
  try {
    fd = fs.openSync(file, "r");
    const head = Buffer.alloc(8); // safetensors: the header's length, 8 bytes little-endian
    fs.readSync(fd, head, 0, 8, 0);
    const size = Number(new DataView(head.buffer, head.byteOffset, 8).getBigUint64(0, true));
    const text = Buffer.alloc(size);
    fs.readSync(fd, text, 0, size, 8);
    const header = JSON.parse(text.toString("utf8"));
    for (const [name, t] of Object.entries(header)) {
      if (name === "__metadata__" || t.dtype !== "F32") continue;
      const [from, to] = t.data_offsets, length = (to - from) / 4;
      if (length < SIGNED) continue;
      const bytes = Buffer.alloc(4 * FIRSTS);
      fs.readSync(fd, bytes, 0, bytes.length, 8 + size + from);
      const firsts = firstValues(new Float32Array(bytes.buffer, bytes.byteOffset, FIRSTS));
      if (!found.has(length)) found.set(length, new Set());
      found.get(length).add(firsts);
    }
  } catch {
    // no file, or not one it reads: no weights known, every array is sent (slower, still right)
  } finally {
    if (fd >= 0) fs.closeSync(fd);
  }
  return found;
}

// All float memory reachable from the roots ({array, source} sharing its bytes, or {array,
// source, tag, commit}: a copy, of a plain array of numbers or a DataView's reading): through
// arrays, Maps (keys and values), Sets, objects and a class's static fields, at any depth (a
// linked list of nodes included), each once
function floatMemories(roots, hd) {
  const seen = new Set(), found = [], stack = [...roots];
  while (stack.length) {
    const obj = stack.pop();
    if (obj === null || (typeof obj !== "object" && typeof obj !== "function") || seen.has(obj)) continue;
    seen.add(obj);
    try { // an object that throws when read (a getter, a proxy) is passed over, not the search
      const memory = obj instanceof DataView ? dataViewMemories(obj, hd) : floatMemory(obj, hd);
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
  if (obj instanceof Float32Array || obj instanceof Float64Array) return { array: obj, source: obj };
  if (obj instanceof Int32Array || obj instanceof Uint32Array) { // float32 bits kept as integers
    return { array: new Float32Array(obj.buffer, obj.byteOffset, obj.length), source: obj };
  }
  if (isBuffer(obj)) return obj.byteLength % 4 === 0 ? { array: new Float32Array(obj), source: obj } : null;
  if (Array.isArray(obj) && obj.length >= hd && obj.length % hd === 0 && obj.every((x) => typeof x === "number")) {
    const array = Float64Array.from(obj);
    return { array, source: obj, commit: () => array.forEach((x, i) => { obj[i] = x; }) };
  }
  return null;
}

// A DataView's values read as float32 and as float64, each both ways, little- and big-endian
// (its methods' default), each a copy put back as it was read: the grader finds the rows in
// the reading that holds them
const READINGS = [[4, "Float32", Float32Array], [8, "Float64", Float64Array]];

const readingsOf = new WeakMap(); // a DataView -> {digest of its rows' first bytes, its readings then}

function dataViewMemories(view, hd) {
  // the first 8 bytes of every float32 row's length: each float32 or float64 row's first values
  let h = 0x811c9dc5 | 0;
  for (let at = 0; at < view.byteLength; at += 4 * hd) {
    for (let i = at; i < Math.min(at + 8, view.byteLength); i++) h = Math.imul(h ^ view.getUint8(i), 16777619);
  }
  const known = readingsOf.get(view);
  if (known?.digest === h) return known.readings; // unchanged: read once, not at every moment
  const readings = readAll(view);
  readingsOf.set(view, { digest: h, readings });
  return readings;
}

function readAll(view) {
  return READINGS.flatMap(([size, kind, Typed]) => [true, false].map((little) => {
    const get = view[`get${kind}`].bind(view), set = view[`set${kind}`].bind(view);
    const array = Typed.from({ length: Math.floor(view.byteLength / size) }, (_, i) => get(size * i, little));
    const commit = () => array.forEach((x, i) => set(size * i, x, little));
    return { array, source: view, tag: `${kind}${little ? "le" : "be"}`, commit };
  }));
}

function isBuffer(obj) {
  return obj instanceof ArrayBuffer || (typeof SharedArrayBuffer !== "undefined" && obj instanceof SharedArrayBuffer);
}

function pushObjects(stack, values) {
  for (const v of values) if (v !== null && typeof v === "object") stack.push(v);
}
