// The top-level declarations of a compiled module, read by a small scanner (the Node worker's
// loader, worker_node_hooks.mjs, hands them to the return watch): the names of its functions,
// classes and variables declared outside any brace, bracket or parenthesis, and where each
// top-level `const` keyword stands. Strings, template literals, comments and regular
// expressions are passed over, so a declaration's words inside them are never taken for one.

const IDENT_START = /[A-Za-z_$]/;
const IDENT_PART = /[\w$]/;
// after these words a `/` begins a regular expression, not a division
const BEFORE_EXPRESSION = new Set(["return", "typeof", "instanceof", "in", "of", "new", "delete",
  "void", "throw", "case", "do", "else", "yield", "await"]);

// [{kind: "word" | "punct", text, at, depth}] of the source's code, depth counting every open
// brace, bracket and parenthesis
function tokens(source) {
  const out = [];
  const opened = []; // the open brackets, and "${" for a template's expression
  let i = 0, last = null;
  const push = (kind, text, at) => {
    last = { kind, text, at, depth: opened.length };
    out.push(last);
  };
  while (i < source.length) {
    const c = source[i];
    if (c === "`" || (c === "}" && opened.at(-1) === "${")) { // a template, or its next part
      if (c === "}") opened.pop();
      i = templatePart(source, i + 1, opened);
      last = { kind: "punct", text: ")", at: i, depth: opened.length }; // a value ended here
      continue;
    }
    if (c === '"' || c === "'") {
      i = stringEnd(source, i);
      last = { kind: "punct", text: ")", at: i, depth: opened.length };
    } else if (source.startsWith("//", i)) {
      i = source.indexOf("\n", i) < 0 ? source.length : source.indexOf("\n", i);
    } else if (source.startsWith("/*", i)) {
      i = source.indexOf("*/", i + 2) < 0 ? source.length : source.indexOf("*/", i + 2) + 2;
    } else if (c === "/" && regexAllowed(last)) {
      i = regexEnd(source, i);
      last = { kind: "punct", text: ")", at: i, depth: opened.length };
    } else if (IDENT_START.test(c)) {
      let j = i + 1;
      while (j < source.length && IDENT_PART.test(source[j])) j++;
      push("word", source.slice(i, j), i);
      i = j;
    } else if ("{([".includes(c)) {
      push("punct", c, i);
      opened.push(c);
      i++;
    } else if ("})]".includes(c)) {
      opened.pop();
      push("punct", c, i);
      i++;
    } else {
      if (!/\s/.test(c)) push("punct", c, i);
      i++;
    }
  }
  return out;
}

function regexAllowed(last) {
  if (last === null) return true;
  if (last.kind === "word") return BEFORE_EXPRESSION.has(last.text);
  return !")]}".includes(last.text) && !/[\d.]/.test(last.text);
}

function stringEnd(source, i) {
  const quote = source[i];
  for (i++; i < source.length && source[i] !== quote && source[i] !== "\n"; i++) {
    if (source[i] === "\\") i++;
  }
  return i + 1;
}

// from inside a template, past its next part: at its closing backtick, or inside a "${"
function templatePart(source, i, opened) {
  for (; i < source.length; i++) {
    if (source[i] === "\\") i++;
    else if (source[i] === "`") return i + 1;
    else if (source.startsWith("${", i)) {
      opened.push("${");
      return i + 2;
    }
  }
  return i;
}

function regexEnd(source, i) {
  let inClass = false;
  for (i++; i < source.length && source[i] !== "\n"; i++) {
    if (source[i] === "\\") i++;
    else if (source[i] === "[") inClass = true;
    else if (source[i] === "]") inClass = false;
    else if (source[i] === "/" && !inClass) break;
  }
  for (i++; i < source.length && IDENT_PART.test(source[i]); i++); // its flags
  return i;
}

// {names, consts}: the top-level declared names, and the offsets of the top-level `const`
// keywords (each declaration whose names include a function the watch may rebind)
export function topLevel(source) {
  const all = tokens(source), names = new Set(), consts = [];
  let declaring = false; // inside a const / let / var statement at the top level
  for (let k = 0; k < all.length; k++) {
    const t = all[k], next = all[k + 1], before = all[k - 1];
    if (t.depth !== 0) continue;
    const member = before?.text === "."; // `x.class`, `x.function`: a property, not a keyword
    if (t.kind === "word" && !member && (t.text === "function" || t.text === "class")) {
      const named = next?.text === "*" ? all[k + 2] : next;
      if (named?.kind === "word" && named.depth === 0) names.add(named.text);
      declaring = false;
    } else if (t.kind === "word" && !member && ["const", "let", "var"].includes(t.text)) {
      declaring = true;
      if (t.text === "const") consts.push(t.at);
      if (next?.kind === "word") names.add(next.text);
    } else if (declaring && t.text === "," && next?.kind === "word" && all[k + 2]?.text === "=") {
      names.add(next.text);
    } else if (t.text === ";") {
      declaring = false;
    }
  }
  return { names: [...names], consts };
}
