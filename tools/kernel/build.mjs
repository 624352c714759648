// Assembles the TypeScript course's kernel (theinference/course/templates/ts/src/kernel.wat)
// into the kernel.wasm beside it, with wabt pinned in this folder's package-lock.json. The
// output is a pure function of the .wat text: `--check` rebuilds in memory and fails when the
// shipped kernel.wasm differs (tests/test_kernel.py runs it).
//
//   npm ci --prefix tools/kernel && node tools/kernel/build.mjs [--check]

import fs from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const source = new URL("../../theinference/course/templates/ts/src/kernel.wat", import.meta.url);
const target = new URL("./kernel.wasm", source);
const features = { simd: true, threads: true }; // f32x4 arithmetic; a shared memory for threads

const wabt = await require("wabt")();
const module = wabt.parseWat("kernel.wat", fs.readFileSync(source, "utf8"), features);
module.validate(features);
const bytes = Buffer.from(module.toBinary({ canonicalize_lebs: true }).buffer);
module.destroy();

if (process.argv.includes("--check")) {
  const shipped = fs.readFileSync(target);
  if (!shipped.equals(bytes)) {
    console.error(`kernel.wasm is not kernel.wat assembled: run node tools/kernel/build.mjs`);
    process.exit(1);
  }
  console.log(`kernel.wasm matches kernel.wat (${bytes.length} bytes)`);
} else {
  fs.writeFileSync(target, bytes);
  console.log(`wrote kernel.wasm (${bytes.length} bytes)`);
}
