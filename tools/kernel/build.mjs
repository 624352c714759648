// Assembles the TypeScript course's kernel (theinference/course/templates/ts/src/kernel.wat)
// into the two binaries beside it, with wabt pinned in this folder's package-lock.json:
//
// - kernel.wasm: the .wat as written (WebAssembly SIMD, which every Node the course supports
//   runs);
// - kernel-fma.wasm: the same, with the tile's eight multiply-adds (`f32x4.add (a) (f32x4.mul
//   (b) (w))`) fused into relaxed SIMD's `f32x4.relaxed_madd`: one instruction and one rounding
//   where the processor has FMA. kernel.ts uses it when the Node running it validates it.
//
// The output is a pure function of the .wat text: `--check` rebuilds in memory and fails when a
// shipped binary differs (tests/test_kernel.py runs it).
//
//   npm ci --prefix tools/kernel && node tools/kernel/build.mjs [--check]

import fs from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const source = new URL("../../theinference/course/templates/ts/src/kernel.wat", import.meta.url);
const SIMD = { simd: true, threads: true }; // f32x4 arithmetic; a shared memory for threads
const RELAXED = { ...SIMD, relaxed_simd: true };
// the tile's accumulators: a_ij += b * w_j, as written in $tile4x8
const MULTIPLY_ADD = /\(f32x4\.add \(local\.get (\$a\d\d)\) \(f32x4\.mul \(local\.get \$b\) \(local\.get (\$w\d)\)\)\)/g;
const TILE_MULTIPLY_ADDS = 8;

const wabt = await require("wabt")();
const text = fs.readFileSync(source, "utf8");

function assemble(wat, features) {
  const module = wabt.parseWat("kernel.wat", wat, features);
  module.validate(features);
  const bytes = Buffer.from(module.toBinary({ canonicalize_lebs: true }).buffer);
  module.destroy();
  return bytes;
}

function fused(wat) {
  const found = wat.match(MULTIPLY_ADD)?.length ?? 0;
  if (found !== TILE_MULTIPLY_ADDS) {
    throw new Error(`kernel.wat: ${found} tile multiply-adds to fuse, not ${TILE_MULTIPLY_ADDS}`);
  }
  return wat.replace(MULTIPLY_ADD, "(f32x4.relaxed_madd (local.get $$b) (local.get $2) (local.get $1))");
}

const binaries = {
  "kernel.wasm": assemble(text, SIMD),
  "kernel-fma.wasm": assemble(fused(text), RELAXED),
};

let stale = 0;
for (const [name, bytes] of Object.entries(binaries)) {
  const target = new URL(`./${name}`, source);
  if (!process.argv.includes("--check")) {
    fs.writeFileSync(target, bytes);
    console.log(`wrote ${name} (${bytes.length} bytes)`);
  } else if (!fs.existsSync(target) || !fs.readFileSync(target).equals(bytes)) {
    console.error(`${name} is not kernel.wat assembled: run node tools/kernel/build.mjs`);
    stale++;
  } else {
    console.log(`${name} matches kernel.wat (${bytes.length} bytes)`);
  }
}
process.exit(stale ? 1 : 0);
