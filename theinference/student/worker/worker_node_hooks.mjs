// Module hooks for the Node worker: after the TypeScript runner has compiled a module of the
// course's src/, add to it what lets the worker see its functions return (the cache-use swap):
// to src/kvcache.ts, one function that wraps a hook by name (protocol.json's hooks, as the
// course spells them); to every module, a call handing its top-level bindings (exported or
// not: worker_node_scan.mjs finds them) to the return watch (worker_node_watch.mjs), which
// wraps them. Inside its own module a binding can be rebound, and every importer sees the new
// one (ES module imports are live), which is what worker.py does with setattr; a top-level
// `const` is made a `let` of the same length (the source map's columns stay right) so that it
// can be.

import { topLevel } from "./worker_node_scan.mjs";

let target = "", sources = "", unwatched = "", probeHook = "";

// hooks: the hook functions' names as the course spells them (the grader's, from the worker's
// command line); sources: the URL of the course's src/ folder; unwatched: a module of it left
// as it is (the provided kernel)
export async function initialize(data) {
  target = data.target;
  sources = data.sources;
  unwatched = data.unwatched;
  probeHook = wrapper(data.hooks);
}

// A function added to the module: it rebinds the hook `name` to `wrap(original)` (when the
// module declares it) and returns what undoes that.
function wrapper(hooks) {
  const cases = hooks.map((name) => `
  if (name === "${name}" && typeof ${name} !== "undefined") {
    const original = ${name};
    ${name} = wrap(original);
    return () => { ${name} = original; };
  }`);
  return `
export function __theinferenceWrap(name, wrap) {${cases.join("")}
  throw new Error("no function " + name);
}
`;
}

export async function load(url, context, nextLoad) {
  const result = await nextLoad(url, context);
  const bare = url.split("?")[0];
  if (!bare.startsWith(sources) || bare === unwatched || result.source == null || result.format !== "module") {
    return result;
  }
  let source = String(result.source);
  const { names, consts } = topLevel(source);
  for (const at of consts) source = `${source.slice(0, at)}let  ${source.slice(at + 5)}`;
  const added = (bare === target ? probeHook : "") + watched(names.filter(watchable));
  // before the source map comment, so the student's line numbers stay right
  const mapAt = source.lastIndexOf("\n//# sourceMappingURL=");
  source = mapAt < 0 ? source + added : source.slice(0, mapAt) + added + source.slice(mapAt);
  return { ...result, source };
}

// a name the module's own code may rebind: not a compiler's helper (esbuild's __name), not a
// reserved word, not eval
function watchable(name) {
  if (name.startsWith("__")) return false;
  try {
    new Function(`"use strict"; let ${name}; ${name} = 0;`);
    return true;
  } catch {
    return false;
  }
}

// the call handing the module's top-level bindings to the return watch, if one is installed
function watched(names) {
  const bindings = names.map((n) => `["${n}",()=>${n},(f)=>{${n}=f;}]`).join(",");
  const watch = "__theinferenceReturns";
  return `\n;{const ${watch}=globalThis[Symbol.for("theinference.returns")];if(${watch})${watch}.module([${bindings}]);}\n`;
}
