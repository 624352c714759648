// Module hooks for the Node worker: after the TypeScript runner has compiled the student's
// src/kvcache.ts, add one function to it that lets the worker wrap a hook (protocol.json's
// hooks, as the course spells them) for the cache-use swap. Inside its own module a function
// declaration can be rebound, and every importer sees the new binding (ES module imports are
// live), which is what worker.py does with setattr.

let target = "", probeHook = "";

// hooks: the hook functions' names as the course spells them (the grader's, from the worker's
// command line)
export async function initialize(data) {
  target = data.target;
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
  if (url.split("?")[0] !== target || result.source == null) return result;
  let source = String(result.source);
  // before the source map comment, so the student's line numbers stay right
  const mapAt = source.lastIndexOf("\n//# sourceMappingURL=");
  source = mapAt < 0 ? source + probeHook : source.slice(0, mapAt) + probeHook + source.slice(mapAt);
  return { ...result, source };
}
