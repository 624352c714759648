// The cache-use swap inside the Node worker (the Python worker's swap.py): the K/V the grader
// sends are found by content in the student's typed arrays and overwritten in place.

// The K/V to find and to write, per layer: [heads, n, headDim] each, found by content in any
// Float32Array/Float64Array reachable from the cache: one row of one head ([headDim]), one
// position's heads ([d]), one head's rows ([N * headDim]) or a whole layer ([heads * N *
// headDim] or [N * d]); written only when every layer's K and V is found.
export function swapCache(roots, plan, blobs) {
  const { heads: h, head_dim: hd, n, layers } = plan;
  const finds = [], writes = [];
  for (let l = 0; l < layers; l++) {
    finds.push(blobs[4 * l], blobs[4 * l + 1]);
    writes.push(blobs[4 * l + 2], blobs[4 * l + 3]);
  }
  const arrays = floatArrays(roots);
  const covered = finds.map(() => new Uint8Array(h * n));
  const places = [];
  const at = (t, i, p, j) => finds[t][(i * n + p) * hd + j];
  // every cell's first value, sorted: a reading is compared only with cells that start like it.
  // A cell's number rides in the low 29 bits of its value as a float64, which a float32 value
  // leaves zero: a native numeric sort keeps both, without an array per cell.
  const cells = finds.length * h * n;
  if (cells > 2 ** 29) return { applied: false, reason: `${cells} cells: more than the index holds` };
  const sorted = new Float64Array(cells);
  const low = new Uint32Array(sorted.buffer); // little-endian: word 2c is value c's low half
  for (let c = 0; c < cells; c++) {
    const t = Math.floor(c / (h * n)), i = Math.floor((c % (h * n)) / n), p = c % n;
    sorted[c] = at(t, i, p, 0);
    low[2 * c] |= c;
  }
  sorted.sort();
  const cellOf = (k) => {
    const c = low[2 * k] & 0x1fffffff;
    return [Math.floor(c / (h * n)), Math.floor((c % (h * n)) / n), c % n];
  };
  const firstAtLeast = (v) => { let lo = 0, hi = cells; while (lo < hi) { const mid = (lo + hi) >> 1; if (sorted[mid] < v) lo = mid + 1; else hi = mid; } return lo; };
  const close = (got, want) => Math.abs(got - want) <= 2e-3 * (1 + Math.abs(want));
  const holds = (a, [offset, headStride, posStride, heads, positions], t, i0, p0) => {
    for (let i = 0; i < heads; i++) {
      for (let p = 0; p < positions; p++) {
        for (let j = 0; j < hd; j++) {
          if (!close(a[offset + i * headStride + p * posStride + j], at(t, i0 + i, p0 + p, j))) return false;
        }
      }
    }
    return true;
  };
  const place = (a, layout, t, i0, p0) => {
    const [offset, headStride, posStride, heads, positions] = layout;
    places.push({ a, offset, headStride, posStride, heads, positions, t, i0, p0 });
    for (let i = 0; i < heads; i++) for (let p = 0; p < positions; p++) covered[t][(i0 + i) * n + p0 + p] = 1;
  };
  // The cells after the last one found: a cache's arrays mostly come in order (one row after
  // another), so the guess saves a search per row of a cache kept as rows.
  const after = (t, i0, p0, heads, positions) => {
    if (p0 + positions < n) return [t, i0, p0 + positions];
    if (i0 + heads < h) return [t, i0 + heads, 0];
    return t + 1 < finds.length ? [t + 1, 0, 0] : null;
  };
  let guess = null;
  for (const a of arrays) {
    for (const layout of layoutsOf(a.length, h, hd, n)) {
      const [offset, , , heads, positions] = layout;
      if (guess && guess.heads === heads && guess.positions === positions) {
        const [t, i0, p0] = guess.cell;
        if (i0 + heads <= h && p0 + positions <= n && holds(a, layout, t, i0, p0)) {
          place(a, layout, t, i0, p0);
          const next = after(t, i0, p0, heads, positions);
          guess = next && { cell: next, heads, positions };
          continue;
        }
      }
      const v = a[offset], tol = 2e-3 * (1 + Math.abs(v));
      for (let k = firstAtLeast(v - tol); k < cells && sorted[k] <= v + tol; k++) {
        const [t, i0, p0] = cellOf(k);
        if ((heads > 1 && i0 !== 0) || (positions > 1 && p0 !== 0)) continue;
        if (!holds(a, layout, t, i0, p0)) continue;
        place(a, layout, t, i0, p0);
        const next = after(t, i0, p0, heads, positions);
        guess = next && { cell: next, heads, positions };
      }
    }
  }
  const missing = covered.findIndex((c) => c.some((x) => !x));
  if (missing >= 0) {
    return { applied: false, reason: `layer ${missing >> 1}'s ${"KV"[missing & 1]} was not found among ${arrays.length} arrays reachable from the cache` };
  }
  for (const { a, offset, headStride, posStride, heads, positions, t, i0, p0 } of places) {
    for (let i = 0; i < heads; i++) {
      for (let p = 0; p < positions; p++) {
        for (let j = 0; j < hd; j++) a[offset + i * headStride + p * posStride + j] = writes[t][((i0 + i) * n + p0 + p) * hd + j];
      }
    }
  }
  return { applied: true, reason: "", places: places.length };
}

// (offset, head stride, position stride, heads, positions) readings of a flat array's length:
// every one that fits (a head's buffer with room for exactly nHead rows is d long too)
function layoutsOf(length, h, hd, n) {
  const d = h * hd;
  const out = [];
  if (length === hd) out.push([0, 0, 0, 1, 1]); // one row of one head
  if (length === d) out.push([0, hd, 0, h, 1]); // one position's heads
  if (length % hd === 0 && length / hd >= n && !(length === hd && n === 1)) {
    out.push([0, 0, hd, 1, n]); // one head's rows
  }
  if (length % d === 0 && length / d >= n && !(length === d && n === 1)) {
    const N = length / d;
    out.push([0, N * hd, hd, h, n], [0, hd, d, h, n]); // [h, N, hd] or [N, h, hd]
  }
  return out;
}

function floatArrays(roots) {
  const seen = new Set(), found = [];
  const walk = (obj, depth) => {
    if (obj === null || typeof obj !== "object" || seen.has(obj) || depth > 8) return;
    seen.add(obj);
    if (obj instanceof Float32Array || obj instanceof Float64Array) return void found.push(obj);
    if (ArrayBuffer.isView(obj)) return;
    const children = obj instanceof Map ? [...obj.values()] : Array.isArray(obj) ? obj : Object.values(obj);
    for (const child of children) walk(child, depth + 1);
  };
  for (const root of roots) walk(root, 0);
  return found;
}
