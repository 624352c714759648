// The swap after the prompt's prefill in the Node worker, wherever it happens and whatever it
// is called (the Python worker's probes.ReturnWatch, by the same rule). Node has no tracer of
// returns, so the course's modules wrap their own functions as they load: worker_node_hooks.mjs
// appends to each module of src/ a call that hands this registry its exported bindings; every
// exported function, every exported class (its construction) and its methods (static ones
// too) and every method of an exported object is wrapped, and its returns are seen while a
// watch is on.
//
// A moment is a return into the adapter, or into a course function up to DEPTH calls below it;
// never one from inside a function named `name` (`prefill`: the K/V are half built there), whose
// own return is a moment wherever it is called from. At the first moment the watch asks the
// grader for the swap; from then on, at each moment, it sends what the returning function was
// given and returned, its `this`, and the modules' exported state (a cache kept at module
// level) to the grader, which finds the K/V in them by content, until the swap is made.

import { PROTOCOL } from "./worker_node_protocol.mjs";
import { Target } from "./worker_node_swap.mjs";

const DEPTH = 4; // course functions between the adapter and a return that is a moment, at most
const NO_MORE = "no cache was found in as many returns after the first as the grader looks at";
const REGISTRY = Symbol.for("theinference.returns");

const wrappers = new WeakSet(); // the functions made here: never wrapped twice
const named = new Map(); // a wrapped function's name -> how many of that name
const states = []; // each course module's reader of its exported bindings' values
let current = null; // the watch of the call under way, if any

// Called before any course module loads: the modules find the registry by its symbol
export function installRegistry() {
  Object.defineProperty(globalThis, REGISTRY, { value: { module: watchModule }, enumerable: false });
}

// bindings: [name, read, rebind] for each exported binding of a course module
function watchModule(bindings) {
  for (const [name, read, rebind] of bindings) {
    try {
      const value = read();
      if (wrappers.has(value)) continue; // re-exported from a module already seen
      if (isClass(value)) {
        wrapMembers(value);
        rebind(wrapClass(value, name));
      } else if (typeof value === "function") rebind(wrapFunction(value, name));
      else if (isPlainObject(value)) wrapMembers(value);
    } catch {
      // a binding re-exported from elsewhere, or one that cannot be rebound: left as it is
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

function wrapFunction(fn, name) {
  if (wrappers.has(fn)) return fn;
  const wrapper = function (...args) {
    return current === null ? invoke(fn, this, args, new.target) : current.call(fn, this, args, name, new.target);
  };
  Object.defineProperty(wrapper, "name", { value: fn.name, configurable: true });
  Object.defineProperty(wrapper, "length", { value: fn.length, configurable: true });
  if (fn.prototype !== undefined) wrapper.prototype = fn.prototype;
  Object.setPrototypeOf(wrapper, fn); // what the module set on the function reads through it
  wrappers.add(wrapper);
  named.set(name, (named.get(name) ?? 0) + 1);
  return wrapper;
}

// A class, whose construction is a call too (a prefill in a constructor returns there): a
// proxy of it, by which `new`, `instanceof`, statics and subclasses work as they did
function wrapClass(cls, name) {
  const proxy = new Proxy(cls, {
    construct(target, args, newTarget) {
      const made = newTarget === proxy ? target : newTarget; // new.target: the class itself
      return current === null ? Reflect.construct(target, args, made) : current.call(target, undefined, args, name, made);
    },
  });
  wrappers.add(proxy);
  named.set(name, (named.get(name) ?? 0) + 1);
  return proxy;
}

function invoke(fn, self, args, newTarget) {
  return newTarget ? Reflect.construct(fn, args, newTarget) : Reflect.apply(fn, self, args);
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
    this.done = false;
    current = this;
  }

  call(fn, self, args, name, newTarget) {
    const isNamed = name === this.name, inside = this.inNamed > 0;
    if (isNamed) this.state.entered += 1;
    this.depth += 1;
    if (isNamed) this.inNamed += 1;
    let out;
    try {
      out = invoke(fn, self, args, newTarget);
    } finally {
      this.depth -= 1;
      if (isNamed) this.inNamed -= 1;
    }
    if (isNamed) this.state.calls += 1;
    if (this.done || !(isNamed || (!inside && this.depth < DEPTH))) return out;
    if (out !== null && typeof out?.then === "function") { // an async function: when it settles
      return out.then((value) => {
        this.moment(value, self, args);
        return value;
      });
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
      this.state.swap = this.target.swap([out, self, ...args, ...moduleStates()]);
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
    this.done = true;
    if (current === this) current = null;
  }

  remove() {
    this.stop();
  }

  report() {
    return { ...this.state };
  }
}
