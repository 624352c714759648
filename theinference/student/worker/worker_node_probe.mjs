// The hook through which the grader swaps a cache, in the Node worker (the Python worker's
// probes.py): the course's function of the hook's name (src/kvcache.ts, wrapped through the
// function worker_node_hooks.mjs adds to it) tells the grader when it returns, and waits for
// its answer: the swap (worker_node_swap.mjs), or the call after which to ask again.

import { PROTOCOL, readFrame, writeMessage } from "./worker_node_protocol.mjs";
import { swapCache } from "./worker_node_swap.mjs";
import { ReturnWatch } from "./worker_node_watch.mjs";

const NONE = { remove() {}, report() { return null; } };

// watch "returns": a ReturnWatch (worker_node_watch.mjs: any function's return, by any name);
// else the function named `name` wrapped
export function installHook(kvcache, name, watch) {
  if (typeof name !== "string") return NONE;
  if (watch === PROTOCOL.hook.watch_returns) return new ReturnWatch(name, exchange);
  // entered: calls begun, returned or not, which tells a refusal made up front from one made
  // after the work had begun (a guard met inside prefill included)
  const state = { hook: name, calls: 0, entered: 0, found: 0, swap: null };
  let restore = null, nextWord = 1; // the call after which to tell the grader next
  try {
    restore = kvcache.__theinferenceWrap(name, (original) => (...args) => {
      state.entered += 1;
      const out = original(...args);
      state.calls += 1;
      if (nextWord === null || state.calls < nextWord) return out; // not to ask before then
      const [answer] = exchange({ outcome: "hooked", probe: { call: state.calls } }, []);
      nextWord = Number.isInteger(answer?.next) ? answer.next : null;
      if (answer && answer.swap) state.swap = guarded(args.slice(2), answer.swap);
      return out;
    });
    state.found = 1;
  } catch {
    state.found = 0;
  }
  return { remove() { if (restore) restore(); }, report() { return { ...state }; } };
}

// The swap's report; a failure of the search itself is reported, never thrown into the
// student's code (where it would read as their error)
function guarded(roots, plan) {
  try {
    return swapCache(roots, plan, exchange);
  } catch (err) {
    return { applied: false, reason: `the grader's search failed: ${err}` };
  }
}

// a hook's word to the grader mid-call, and its answer
function exchange(header, blobs) {
  writeMessage(header, blobs);
  return readFrame();
}
