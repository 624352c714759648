// Runs inside a TypeScript student's process: imports their tests/adapters.ts (compiled by the
// course's tsx) and calls what it is asked. The Node twin of worker.py, speaking the same
// protocol: requests as 8-byte length + JSON on one private pipe; replies as 8-byte length,
// 4-byte JSON length, JSON, then raw array bytes on another. stdout and stderr are the student's.
// It imports nothing of the grader; the grader judges every reply.

import fs from "node:fs";
import { register } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";
import v8 from "node:v8";
import { swapCache } from "./worker_node_swap.mjs";

const MAX_ITEMS = 4096; // items described per list when a value is not one numeric array
const EQUIVALENT_EXCEPTIONS = { RangeError: "ValueError" }; // the grader's names for refusals

const [reqFd, respFd] = process.argv.slice(2, 4).map(Number);
const courseDir = fs.realpathSync(process.argv[4]);
const kvcacheUrl = pathToFileURL(path.join(courseDir, "src", "kvcache.ts")).href;

async function main() {
  register(new URL("./worker_node_hooks.mjs", import.meta.url), {
    data: { target: kvcacheUrl },
  });
  writeMessage({ outcome: "ready" }, []);
  // the grader places this process where its CPU is accounted, then says go: nothing of the
  // course is imported before that
  if (readMessage() === null) process.exit(0);
  if (process.argv[6] === "calibrate") {
    writeMessage({ outcome: "loaded" }, []);
    return calibrate();
  }
  const [adapters, importFailure] = await importAdapters();
  const kvcache = adapters ? await import(kvcacheUrl).catch(() => null) : null;
  writeMessage({ outcome: "loaded" }, []);
  let request;
  while ((request = readMessage()) !== null) {
    const reply = importFailure ?? (await callAdapter(adapters, kvcache, request));
    writeMessage(...encodeReply(reply));
  }
  process.exit(0); // timers the student left running must not keep the process alive
}

async function importAdapters() {
  try {
    return [await import(pathToFileURL(path.join(courseDir, "tests", "adapters.ts")).href), null];
  } catch (err) {
    return [null, {
      outcome: "import_error",
      message: `importing tests/adapters.ts failed: ${describeError(err)}`,
      traceback: studentStack(err),
    }];
  }
}

export function camelCase(name) {
  return name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
}

async function callAdapter(adapters, kvcache, request) {
  const name = camelCase(request.adapter);
  const args = request.args;
  const fn = adapters[name];
  if (typeof fn !== "function") {
    return { outcome: "missing", message: `tests/adapters.ts exports no function ${name}()` };
  }
  if (fn.length > args.length) {
    return {
      outcome: "signature",
      message: `${name} takes ${fn.length} argument(s), the grader passes ${args.length}`,
    };
  }
  const probe = installHook(kvcache, request.hook);
  let value;
  try {
    value = await fn(...args);
  } catch (err) {
    if (err instanceof Error && err.name === "NotImplementedError") {
      return { outcome: "todo", message: err.message || `${name} is not implemented yet` };
    }
    const kind = err instanceof Error ? err.name : typeof err;
    return {
      outcome: "raised",
      exception: EQUIVALENT_EXCEPTIONS[kind] ?? kind,
      message: describeError(err),
      traceback: studentStack(err),
      probe: probe.report(), // a refusal's: did the work start before it?
    };
  } finally {
    probe.remove();
  }
  return { outcome: "returned", value, probe: probe.report() };
}

// --- calibration: the grader's own matrix product, no student code loaded -----------------

// The course's provided kernel (src/kernel.ts, which gpt2.ts multiplies with; the grader checks
// it and its binaries are the template's own before it asks), with relaxed SIMD switched on
// where this Node keeps it behind a flag: the kernel at its fastest, whatever flags the
// student's own process sets for itself. A kernel that does not load (a course whose src/ Node
// refuses, say) fails the calibration: a slower stand-in would loosen every floor.
async function calibrate() {
  switchOnRelaxedSimd();
  let product = null, failure = null;
  try {
    ({ product } = await import(pathToFileURL(path.join(courseDir, "src", "kernel.ts")).href));
    if (typeof product !== "function") throw new Error("it exports no product()");
  } catch (err) {
    failure = `src/kernel.ts did not load: ${describeError(err)}`;
  }
  let request;
  while ((request = readMessage()) !== null) {
    if (failure) {
      writeMessage({ outcome: "raised", exception: "Error", message: failure }, []);
      continue;
    }
    const [m, k, n, repeat] = request.args.map(Number);
    const a = new Float32Array(m * k).fill(0.5), b = new Float32Array(k * n).fill(0.25);
    const rows = Array.from({ length: m }, (_, i) => a.subarray(i * k, (i + 1) * k));
    for (let r = 0; r < repeat; r++) product(rows, b, k, n);
    writeMessage({ outcome: "returned", value: { kind: "none" } }, []);
  }
  process.exit(0);
}

function switchOnRelaxedSimd() {
  try {
    const fused = fs.readFileSync(path.join(courseDir, "src", "kernel-fma.wasm"));
    if (!WebAssembly.validate(fused)) v8.setFlagsFromString("--experimental-wasm-relaxed-simd");
  } catch {
    // no such file: the byte check has failed the calibration already
  }
}

// --- the hook through which the grader swaps a cache (the Python worker's probes.py, swap.py) ---

function installHook(kvcache, name) {
  const none = { remove() {}, report() { return null; } };
  if (typeof name !== "string") return none;
  // entered: calls begun, returned or not, which tells a refusal made up front from one made
  // after the work had begun (a guard met inside prefill included)
  const state = { hook: name, calls: 0, entered: 0, found: 0, swap: null };
  let restore = null, nextWord = 1; // the call after which to tell the grader next
  try {
    restore = kvcache.__theinferenceWrap(camelCase(name), (original) => (...args) => {
      state.entered += 1;
      const out = original(...args);
      state.calls += 1;
      if (nextWord === null || state.calls < nextWord) return out; // not to ask before then
      writeMessage({ outcome: "hooked", probe: { call: state.calls } }, []);
      const [answer, blobs] = readFrame();
      nextWord = Number.isInteger(answer?.next) ? answer.next : null;
      if (answer && answer.swap) state.swap = swapCache(args.slice(2), answer.swap, blobs);
      return out;
    });
    state.found = 1;
  } catch {
    state.found = 0;
  }
  return { remove() { if (restore) restore(); }, report() { return { ...state }; } };
}

function readFrame() {
  const prefix = readExactly(12);
  if (!prefix) return [{}, []];
  const size = Number(prefix.readBigUInt64LE(0)), textLen = prefix.readUInt32LE(8);
  const body = readExactly(size - 4);
  const header = JSON.parse(body.subarray(0, textLen).toString("utf8"));
  const blobs = [];
  let at = textLen;
  for (const n of header.blob_sizes ?? []) {
    blobs.push(new Float32Array(body.buffer.slice(body.byteOffset + at, body.byteOffset + at + n)));
    at += n;
  }
  return [header, blobs];
}

function describeError(err) {
  if (!(err instanceof Error)) return `threw a non-Error value: ${String(err).slice(0, 200)}`;
  const text = err.message.split(courseDir + path.sep).join("");
  return text ? `${err.name}: ${text}` : err.name;
}

// The stack trimmed to frames in the course's own files, paths relative, with the source line
function studentStack(err) {
  const stack = err instanceof Error && typeof err.stack === "string" ? err.stack : "";
  const frames = [];
  for (const line of stack.split("\n").slice(1)) {
    const m = line.match(/^\s*at (?:(.*?) \()?(?:file:\/\/)?(\/[^():]+):(\d+):(\d+)\)?$/);
    if (!m) continue;
    const file = decodeURI(m[2]);
    if (!file.startsWith(courseDir + path.sep) || file.includes(`${path.sep}node_modules${path.sep}`)) continue;
    const rel = path.relative(courseDir, file);
    const where = `  at ${m[1] ? m[1] + " " : ""}(${rel}:${m[3]}:${m[4]})`;
    frames.push(`${where}\n    ${sourceLine(file, Number(m[3]))}`);
  }
  const head = frames.length ? ["Stack (your code, most recent call first):", ...frames] : [];
  return [...head, describeError(err)].join("\n") + "\n";
}

function sourceLine(file, lineNo) {
  try {
    return (fs.readFileSync(file, "utf8").split("\n")[lineNo - 1] ?? "").trim();
  } catch {
    return "";
  }
}

// --- encoding a reply: JSON describing the value, plus the raw bytes of its arrays ----------

const TYPED = [
  [Float32Array, "<f4"], [Float64Array, "<f8"], [Int8Array, "|i1"], [Uint8Array, "|u1"],
  [Int16Array, "<i2"], [Uint16Array, "<u2"], [Int32Array, "<i4"], [Uint32Array, "<u4"],
];

function encodeReply(reply) {
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
  if (Array.isArray(value) && depth < 4) {
    // e.g. per-layer [k, v] pairs, or [logits, reused]: described item by item
    const items = value.slice(0, MAX_ITEMS).map((v) => describe(v, blobs, depth + 1));
    return { kind: "seq", items, length: value.length };
  }
  return { kind: "other", type: typeName(value) };
}

function typeName(value) {
  if (Array.isArray(value)) return "Array";
  if (typeof value === "object") return value.constructor?.name ?? "object";
  return typeof value;
}

// A number, typed array, or rectangular nesting of them, as one array (like np.asarray);
// null when it is not one. Integers stay integers (token ids); other numbers are float64.
function asArray(value) {
  const leaves = [];
  const shape = shapeOf(value, leaves, 0);
  if (!shape) return null;
  const kinds = new Set(leaves.map(leafDtype));
  const dtype = kinds.size === 1 ? [...kinds][0] : kinds.has("<f8") || kinds.has("<i8") ? "<f8" : "<f4";
  const Out = { "<f4": Float32Array, "<f8": Float64Array, "<i8": BigInt64Array }[dtype]
    ?? TYPED.find(([, d]) => d === dtype)[0];
  const total = shape.reduce((a, b) => a * b, 1);
  const out = new Out(total);
  let at = 0;
  for (const leaf of leaves) {
    if (typeof leaf === "number") out[at++] = Out === BigInt64Array ? BigInt(leaf) : leaf;
    else if (Out === BigInt64Array) for (const x of leaf) out[at++] = BigInt(x);
    else out.set(leaf, at), (at += leaf.length);
  }
  return { dtype, shape, bytes: Buffer.from(out.buffer, out.byteOffset, out.byteLength) };
}

function leafDtype(leaf) {
  if (typeof leaf === "number") return Number.isSafeInteger(leaf) ? "<i8" : "<f8";
  if (Array.isArray(leaf)) return leaf.every(Number.isSafeInteger) ? "<i8" : "<f8";
  return TYPED.find(([T]) => leaf instanceof T)[1];
}

function shapeOf(value, leaves, depth) {
  if (typeof value === "number") return leaves.push(value), [];
  if (TYPED.some(([T]) => value instanceof T)) return leaves.push(value), [value.length];
  if (!Array.isArray(value) || depth > 4) return null;
  if (value.length > 0 && value.every((x) => typeof x === "number")) {
    return leaves.push(value), [value.length];
  }
  if (value.length === 0) return [0];
  let inner = null;
  for (const item of value) {
    const s = shapeOf(item, leaves, depth + 1);
    if (!s || (inner && s.join() !== inner.join()) || s.length === 0) return null;
    inner = s;
  }
  return [value.length, ...inner];
}

// --- framing --------------------------------------------------------------------------------

function readExactly(n) {
  const buf = Buffer.alloc(n);
  let got = 0;
  while (got < n) {
    let read;
    try {
      read = fs.readSync(reqFd, buf, got, n - got, null);
    } catch (err) {
      if (err.code === "EAGAIN") continue;
      if (err.code === "EOF") return null;
      throw err;
    }
    if (read === 0) return null;
    got += read;
  }
  return buf;
}

function readMessage() {
  const prefix = readExactly(8);
  if (!prefix) return null;
  const body = readExactly(Number(prefix.readBigUInt64LE(0)));
  return body ? JSON.parse(body.toString("utf8")) : null;
}

function writeMessage(header, blobs) {
  const text = Buffer.from(JSON.stringify({ ...header, blob_sizes: blobs.map((b) => b.length) }));
  const prefix = Buffer.alloc(12);
  prefix.writeBigUInt64LE(BigInt(4 + text.length + blobs.reduce((a, b) => a + b.length, 0)), 0);
  prefix.writeUInt32LE(text.length, 8);
  for (const chunk of [prefix, text, ...blobs]) {
    let off = 0;
    while (off < chunk.length) off += fs.writeSync(respFd, chunk, off, chunk.length - off);
  }
}

main();
