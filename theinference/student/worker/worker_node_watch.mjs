// The swap after the prompt's prefill in the Node worker, wherever it happens and whatever it
// is called (the Python worker's probes.ReturnWatch, by the same rule). Node has no tracer of
// returns, so the course's modules wrap their own functions as they load: worker_node_hooks.mjs
// appends to each module of src/ a call that hands this registry its top-level bindings; every
// function, every method of a class (static ones too) and of a plain object among them is
// wrapped, in place, and its calls are seen while a watch is on.
//
// A moment is a return into the adapter, or into a course function up to DEPTH calls below it
// from a call that lasted LONG or more; never one from inside a function named `name`
// (`prefill`: the K/V are half built there), whose own return is a moment wherever it is called
// from; and the start of a call from the adapter
// (whatever the adapter did before it is done: a prefill in a constructor, say). At the first
// moment the watch asks the grader for the swap; from then on, at each moment, it sends what
// the function was given and returned, its `this`, and the modules' top-level values (a cache
// kept at module level) to the grader, which finds the K/V in them by content, until the swap
// is made. An async function's moment is when its promise settles, before its caller resumes.

import { PROTOCOL } from "./worker_node_protocol.mjs";
import { Target } from "./worker_node_swap.mjs";

const DEPTH = 4; // course functions between the adapter and a return that is a moment, at most
// below the adapter, the least milliseconds a call lasts for its return to be a moment: any
// prefill's does (a token through every layer), a helper's called per row or value does not
// (each moment looks at what the cache holds: at each of those, it cost a thousand times the
// student's own work)
const LONG = 1;
const SHORT = 8;
const NO_MORE = "no cache was found in as many returns after the first as the grader looks at";
const REGISTRY = Symbol.for("theinference.returns");

const wrappers = new WeakSet(); // the functions made here: never wrapped twice
const named = new Map(); // a wrapped function's name -> how many of that name
const states = []; // each course module's reader of its top-level bindings' values
let current = null; // the watch of the call under way, if any

// Called before any course module loads: the modules find the registry by its symbol
export function installRegistry() {
  Object.defineProperty(globalThis, REGISTRY, { value: { module: watchModule }, enumerable: false });
}

// bindings: [name, read, rebind] for each top-level binding of a course module
function watchModule(bindings) {
  for (const [name, read, rebind] of bindings) {
    try {
      const value = read();
      if (wrappers.has(value)) continue; // imported from a module already seen
      if (isClass(value) || isPlainObject(value)) wrapMembers(value);
      else if (typeof value === "function") rebind(wrapFunction(value, name));
    } catch {
      // a binding that cannot be read or rebound: left as it is
    }
  }
  states.push(() => bindings.map(([, read]) => {
    try {
      return read();
    } catch {
      return null;
    }
  }));
}

// a class's methods (its prototype's and its static ones) or an object's, wrapped in place
function wrapMembers(holder) {
  const places = isClass(holder) ? [holder.prototype, holder] : [holder];
  for (const place of places) {
    for (const key of Reflect.ownKeys(place)) {
      if (key === "constructor" || key === "prototype") continue;
      const d = Object.getOwnPropertyDescriptor(place, key);
      if (typeof d?.value !== "function" || isClass(d.value) || !d.writable || !d.configurable) continue;
      Object.defineProperty(place, key, { ...d, value: wrapFunction(d.value, String(key)) });
    }
  }
}

// A function's stand-in: what its callers see of it stays as it was (its name, length, own
// properties, source text, and as a constructor its instances' `constructor`)
function wrapFunction(fn, name) {
  if (wrappers.has(fn)) return fn;
  const timing = { short: 0 }; // its calls in a row below the adapter that were not LONG
  const wrapper = function () {
    if (current !== null) return current.call(fn, this, arguments, name, new.target, timing);
    return new.target ? Reflect.construct(fn, arguments, new.target) : fn.apply(this, arguments);
  };
  for (const key of Reflect.ownKeys(fn)) {
    if (key === "arguments" || key === "caller") continue;
    Object.defineProperty(wrapper, key, Object.getOwnPropertyDescriptor(fn, key));
  }
  Object.setPrototypeOf(wrapper, fn); // a property the module sets on it later reads through
  Object.defineProperty(wrapper, "toString", { value: () => Function.prototype.toString.call(fn), configurable: true, writable: true });
  if (fn.prototype?.constructor === fn) fn.prototype.constructor = wrapper;
  wrappers.add(wrapper);
  named.set(name, (named.get(name) ?? 0) + 1);
  return wrapper;
}

function isClass(value) {
  return typeof value === "function" && /^class\b/.test(Function.prototype.toString.call(value));
}

function isPlainObject(value) {
  if (value === null || typeof value !== "object") return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function moduleStates() {
  return states.flatMap((read) => read());
}

export class ReturnWatch {
  // exchange(header, blobs) -> [answer, blobs]: a word to the grader and its answer
  constructor(name, exchange) {
    this.name = name;
    this.exchange = exchange;
    this.state = { hook: name, calls: 0, entered: 0, found: named.get(name) ?? 0, swap: null,
      watch: PROTOCOL.hook.watch_returns, moments: 0 };
    this.depth = 0; // wrapped calls under way
    this.inNamed = 0; // of them, calls of a function named `name`
    this.target = null; // the swap, once the grader has sent it
    this.last = null; // the last moment looked at, where the plan bounds them
    current = this;
  }

  get done() { // stopped, or its call has ended (the next call's watch is on)
    return current !== this;
  }

  call(fn, self, args, name, newTarget, timing) {
    const isNamed = name === this.name, inside = this.inNamed > 0;
    // a function short SHORT times in a row is not timed again (a clock read costs more than a
    // helper called per value): its returns below the adapter are no moments
    const timed = this.depth > 0 && this.depth < DEPTH && !inside && timing.short < SHORT;
    const started = timed ? performance.now() : 0;
    if (this.depth === 0) this.moment(undefined, self, args); // the adapter's earlier work is done
    if (isNamed) this.state.entered += 1;
    this.depth += 1;
    if (isNamed) this.inNamed += 1;
    let out;
    try {
      out = newTarget ? Reflect.construct(fn, args, newTarget) : fn.apply(self, args);
    } finally {
      this.depth -= 1;
      if (isNamed) this.inNamed -= 1;
    }
    if (isNamed) this.state.calls += 1;
    const long = timed && performance.now() - started >= LONG;
    if (timed) timing.short = long ? 0 : timing.short + 1;
    if (this.done || (this.depth > 0 && !long && !isNamed)) return out;
    if (out instanceof Promise) { // an async function: when it settles, before its caller resumes
      out.then((value) => this.moment(value, self, args), () => {});
      return out;
    }
    this.moment(out, self, args);
    return out;
  }

  moment(out, self, args) {
    if (this.done) return;
    this.state.moments += 1;
    if (this.target === null && !this.begin()) return;
    if (this.last !== null && this.state.moments > this.last) {
      this.state.swap = { applied: false, stop: true, reason: NO_MORE };
      return this.stop();
    }
    try {
      this.state.swap = this.target.swap([out, self, ...Array.from(args), ...moduleStates()]);
    } catch (err) { // the search's own failure, never thrown into the student's code
      this.state.swap = { applied: false, reason: `the grader's search failed: ${err}` };
    }
    if (this.state.swap.applied || this.state.swap.stop) this.stop();
  }

  // the first moment: the grader's swap, or none for this call (then the watch stops)
  begin() {
    const [answer] = this.exchange({ outcome: "hooked", probe: { call: this.state.moments } }, []);
    const plan = answer?.swap;
    if (plan === null || typeof plan !== "object") {
      this.stop();
      return false;
    }
    try {
      this.target = new Target(plan, this.exchange);
    } catch (err) {
      this.state.swap = { applied: false, reason: `the grader's search failed: ${err}` };
      this.stop();
      return false;
    }
    this.last = Number.isInteger(plan.moments) ? this.state.moments + plan.moments : null;
    return true;
  }

  stop() {
    if (current === this) current = null;
  }

  remove() {
    this.stop();
  }

  report() {
    return { ...this.state };
  }
}
