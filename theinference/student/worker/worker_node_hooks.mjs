// Module hooks for the Node worker: after the TypeScript runner has compiled a module of the
// course's src/, add to it what lets the worker see its functions return (the cache-use swap):
// to src/kvcache.ts, one function that wraps a hook by name (protocol.json's hooks, as the
// course spells them); to every module, a call handing its exported bindings to the return
// watch (worker_node_watch.mjs), which wraps them. Inside its own module a binding can be
// rebound, and every importer sees the new one (ES module imports are live), which is what
// worker.py does with setattr; an exported `const` is made a `let` of the same length (the
// source map's columns stay right) so that it can be.

let target = "", sources = "", probeHook = "";

// hooks: the hook functions' names as the course spells them (the grader's, from the worker's
// command line); sources: the URL of the course's src/ folder
export async function initialize(data) {
  target = data.target;
  sources = data.sources;
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
  if (!bare.startsWith(sources) || result.source == null || result.format !== "module") return result;
  let source = String(result.source);
  const names = exportedNames(source);
  source = rebindable(source, names);
  const added = (bare === target ? probeHook : "") + watched(names);
  // before the source map comment, so the student's line numbers stay right
  const mapAt = source.lastIndexOf("\n//# sourceMappingURL=");
  source = mapAt < 0 ? source + added : source.slice(0, mapAt) + added + source.slice(mapAt);
  return { ...result, source };
}

const NAME = "[A-Za-z_$][\\w$]*";

// The local names a compiled module exports: its `export { a, b as c }` lists (not those
// re-exported `from` another module) and its `export function / class / const` declarations
function exportedNames(source) {
  const names = new Set();
  for (const m of source.matchAll(/\bexport\s*\{([^}]*)\}(\s*from\b)?/g)) {
    if (m[2]) continue;
    for (const part of m[1].split(",")) {
      const local = part.trim().split(/\s+as\s+/)[0];
      if (new RegExp(`^${NAME}$`).test(local)) names.add(local);
    }
  }
  const declared = new RegExp(`\\bexport\\s+(?:default\\s+)?(?:async\\s+)?(?:function\\s*\\*?|class|const|let|var)\\s*(${NAME})`, "g");
  for (const m of source.matchAll(declared)) names.add(m[1]);
  return [...names].filter(bindable);
}

// whether a name can be declared and assigned in a module (not a reserved word, not eval)
function bindable(name) {
  try {
    new Function(`"use strict"; let ${name}; ${name} = 0;`);
    return true;
  } catch {
    return false;
  }
}

// each exported `const NAME =` made `let   NAME =`: as long, and rebindable
function rebindable(source, names) {
  for (const name of names) {
    const at = new RegExp(`(?<![\\w$.])const(\\s+${name.replace(/\$/g, "\\$")}\\s*=)`, "g");
    source = source.replace(at, "let  $1");
  }
  return source;
}

// the call handing the module's exported bindings to the return watch, if one is installed
function watched(names) {
  const bindings = names.map((n) => `["${n}",()=>${n},(f)=>{${n}=f;}]`).join(",");
  const watch = "__theinferenceReturns";
  return `\n;{const ${watch}=globalThis[Symbol.for("theinference.returns")];if(${watch})${watch}.module([${bindings}]);}\n`;
}
