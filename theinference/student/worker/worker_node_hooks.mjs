// Module hooks for the Node worker: after the TypeScript runner has compiled the student's
// src/kvcache.ts, add one function to it that lets the worker wrap `prefill` or `attnStep` for
// the cache-use swap. Inside its own module a function declaration can be rebound, and every importer sees
// the new binding (ES module imports are live), which is what worker.py does with setattr.

let target = "";

export async function initialize(data) {
  target = data.target;
}

const PROBE_HOOK = `
export function __theinferenceWrap(name, wrap) {
  if (name === "prefill") {
    const original = prefill;
    prefill = wrap(original);
    return () => { prefill = original; };
  }
  if (name === "attnStep") {
    const original = attnStep;
    attnStep = wrap(original);
    return () => { attnStep = original; };
  }
  throw new Error("no function " + name);
}
`;

export async function load(url, context, nextLoad) {
  const result = await nextLoad(url, context);
  if (url.split("?")[0] !== target || result.source == null) return result;
  let source = String(result.source);
  // before the source map comment, so the student's line numbers stay right
  const mapAt = source.lastIndexOf("\n//# sourceMappingURL=");
  source = mapAt < 0 ? source + PROBE_HOOK : source.slice(0, mapAt) + PROBE_HOOK + source.slice(mapAt);
  return { ...result, source };
}
