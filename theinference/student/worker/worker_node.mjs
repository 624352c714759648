// Runs inside a TypeScript student's process: imports their tests/adapters.ts (compiled by the
// course's tsx) and calls what it is asked. The Node twin of worker.py, speaking the protocol
// protocol.json states (worker_node_protocol.mjs reads it): requests on one private pipe,
// replies on another. stdout and stderr are the student's. Its parts are the other
// worker_node_*.mjs of this folder; it imports nothing of the grader, which judges every reply.

import fs from "node:fs";
import { register } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";
import v8 from "node:v8";
import { describeError, setCourseDir, studentStack } from "./worker_node_errors.mjs";
import { installHook } from "./worker_node_probe.mjs";
import { installRegistry } from "./worker_node_watch.mjs";
import { PROTOCOL, openPipes, readMessage, readRequest, writeMessage } from "./worker_node_protocol.mjs";
import { encodeReply } from "./worker_node_values.mjs";

const TODO = PROTOCOL.exceptions.todo; // the stub's error, by the name both languages give it

// launch.py's arguments: the pipes, the course, the memory limit (the heap's flag has it), the
// mode, and the functions a hook may wrap, spelled as the course does (its language's names)
const [requestFd, replyFd, courseArg, , mode, hookArg] = process.argv.slice(2);
openPipes(Number(requestFd), Number(replyFd));
const courseDir = fs.realpathSync(courseArg);
setCourseDir(courseDir);
// pasted into the code the hooks module generates: identifiers only, or the grader that
// started this worker speaks another layout (a fault of the grader's, never the student's)
const HOOKS = (hookArg ?? "").split(",");
if (!HOOKS.every((name) => /^[A-Za-z_$][\w$]*$/.test(name))) process.exit(PROTOCOL.framing.malformed_exit);
const kvcacheUrl = pathToFileURL(path.join(courseDir, "src", "kvcache.ts")).href;
const sourcesUrl = pathToFileURL(path.join(courseDir, "src")).href + "/";
// the provided kernel's module: its heap holds the weights, its functions are not the course's
// own work (calibrate() checks it is the provided one): not watched
const kernelUrl = pathToFileURL(path.join(courseDir, "src", "kernel.ts")).href;

async function main() {
  register(new URL("./worker_node_hooks.mjs", import.meta.url), {
    data: { target: kvcacheUrl, sources: sourcesUrl, unwatched: kernelUrl, hooks: HOOKS },
  });
  writeMessage({ outcome: "ready" }, []);
  // the grader places this process where its CPU is accounted, then says go: nothing of the
  // course is imported before that
  if (readMessage() === null) process.exit(0);
  if (mode === "calibrate") {
    writeMessage({ outcome: "loaded" }, []);
    return calibrate();
  }
  installRegistry(); // before the course's modules load: they hand it their functions
  const [adapters, importFailure] = await importAdapters();
  const kvcache = adapters ? await import(kvcacheUrl).catch(() => null) : null;
  writeMessage({ outcome: "loaded" }, []);
  let request;
  while ((request = readRequest()) !== null) {
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

async function callAdapter(adapters, kvcache, request) {
  const name = request.adapter; // as the course spells it: the grader sends it so
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
  const probe = installHook(kvcache, request.hook, request.watch);
  let value;
  try {
    value = await fn(...args);
  } catch (err) {
    if (err instanceof Error && err.name === TODO) {
      return { outcome: "todo", message: err.message || `${name} is not implemented yet` };
    }
    const kind = err instanceof Error ? err.name : typeof err;
    return {
      outcome: "raised",
      exception: kind, // the grader reads it back as its own (its language object's names)
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
    ({ product } = await import(kernelUrl));
    if (typeof product !== "function") throw new Error("it exports no product()");
  } catch (err) {
    failure = `src/kernel.ts did not load: ${describeError(err)}`;
  }
  let request;
  while ((request = readRequest()) !== null) {
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

main();
