// Encoding a reply in the Node worker (the Python worker's wire.py, describe): JSON describing
// the returned value, plus the raw bytes of its arrays, in protocol.json's value kinds.

import { LIMITS, PROTOCOL } from "./worker_node_protocol.mjs";

const VALUES = PROTOCOL.values;
const TYPED = Object.entries(VALUES.typed_arrays).map(([name, dtype]) => [globalThis[name], dtype]);
const BIG = new Set([BigInt64Array, BigUint64Array]);

export function encodeReply(reply) {
  const blobs = [];
  if (reply.outcome === "returned") reply = { ...reply, value: describe(reply.value, blobs, 0) };
  return [reply, blobs];
}

function describe(value, blobs, depth) {
  if (value === null || value === undefined) return { kind: "none" };
  const numeric = asArray(value);
  if (numeric) {
    blobs.push(numeric.bytes);
    return { kind: "array", dtype: numeric.dtype, shape: numeric.shape, blob: blobs.length - 1, from: typeName(value) };
  }
  if (Array.isArray(value) && depth < LIMITS.max_seq_depth) {
    // e.g. per-layer [k, v] pairs, or [logits, reused]: described item by item
    const items = value.slice(0, LIMITS.max_items).map((v) => describe(v, blobs, depth + 1));
    return { kind: "seq", items, length: value.length };
  }
  return { kind: "other", type: typeName(value) };
}

function typeName(value) {
  if (Array.isArray(value)) return "Array";
  if (value !== null && typeof value === "object") return value.constructor?.name ?? "object";
  return typeof value;
}

// A number, boolean, typed array, or rectangular nesting of them, as one array (like
// np.asarray); null when it is not one. Integers stay integers (token ids); other numbers are
// float64; several dtypes together take the one NumPy would.
function asArray(value) {
  const leaves = [];
  const shape = shapeOf(value, leaves, 0);
  if (!shape) return null;
  const dtype = joined(new Set(leaves.map(leafDtype)));
  const Out = TYPED.find(([, d]) => d === dtype)?.[0] ?? Uint8Array; // Uint8Array: booleans
  const out = new Out(shape.reduce((a, b) => a * b, 1));
  let at = 0;
  const put = (x) => { out[at++] = BIG.has(Out) ? BigInt(x) : Number(x); };
  for (const leaf of leaves) {
    if (typeof leaf === "number" || typeof leaf === "boolean") put(leaf);
    else if (!Array.isArray(leaf) && BIG.has(Out) === BIG.has(leaf.constructor)) out.set(leaf, at), (at += leaf.length);
    else for (const x of leaf) put(x);
  }
  return { dtype, shape, bytes: Buffer.from(out.buffer, out.byteOffset, out.byteLength) };
}

// NumPy's promotion, for the dtypes a worker meets: one dtype stays itself; booleans join any
// number; integers alone make int64; floats of 32 bits alone float32; else float64
function joined(kinds) {
  kinds.delete(VALUES.boolean);
  if (kinds.size === 0) return VALUES.boolean;
  if (kinds.size === 1) return [...kinds][0];
  if ([...kinds].every((d) => d[1] !== "f")) return VALUES.integer;
  if ([...kinds].every((d) => d === "<f4" || d[2] === "1" || d === "<i2" || d === "<u2")) return "<f4";
  return VALUES.float;
}

function leafDtype(leaf) {
  if (typeof leaf === "boolean") return VALUES.boolean;
  if (typeof leaf === "number") return Number.isSafeInteger(leaf) ? VALUES.integer : VALUES.float;
  if (Array.isArray(leaf)) return leaf.length ? joined(new Set(leaf.map(leafDtype))) : VALUES.float;
  return TYPED.find(([T]) => leaf instanceof T)[1];
}

const isScalar = (x) => typeof x === "number" || typeof x === "boolean";

function shapeOf(value, leaves, depth) {
  if (isScalar(value)) return leaves.push(value), [];
  if (TYPED.some(([T]) => value instanceof T)) return leaves.push(value), [value.length];
  if (!Array.isArray(value) || depth >= LIMITS.max_dims) return null;
  if (value.length > 0 && value.every(isScalar)) return leaves.push(value), [value.length];
  if (value.length === 0) return leaves.push(value), [0];
  let inner = null;
  for (const item of value) {
    const s = shapeOf(item, leaves, depth + 1);
    if (!s || (inner && s.join() !== inner.join()) || s.length === 0) return null;
    inner = s;
  }
  return [value.length, ...inner];
}
