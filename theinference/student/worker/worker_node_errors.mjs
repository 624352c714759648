// The student's errors, told in the student's terms (the Python worker's tracebacks.py): the
// message with the course's paths made relative, and the stack cut to the course's own files.

import fs from "node:fs";
import path from "node:path";

let courseDir = "";

export function setCourseDir(dir) {
  courseDir = dir;
}

export function describeError(err) {
  if (!(err instanceof Error)) return `threw a non-Error value: ${String(err).slice(0, 200)}`;
  const text = err.message.split(courseDir + path.sep).join("");
  return text ? `${err.name}: ${text}` : err.name;
}

// The stack trimmed to frames in the course's own files, paths relative, with the source line
export function studentStack(err) {
  const stack = err instanceof Error && typeof err.stack === "string" ? err.stack : "";
  const frames = [];
  for (const line of stack.split("\n").slice(1)) {
    const m = line.match(/^\s*at (?:(.*?) \()?(?:file:\/\/)?(\/[^():]+):(\d+):(\d+)\)?$/);
    if (!m) continue;
    const file = decodeURI(m[2]);
    if (!file.startsWith(courseDir + path.sep) || file.includes(`${path.sep}node_modules${path.sep}`)) continue;
    const rel = path.relative(courseDir, file);
    const where = `  at ${m[1] ? m[1] + " " : ""}(${rel}:${m[3]}:${m[4]})`;
    frames.push(`${where}\n    ${sourceLine(file, Number(m[3]))}`);
  }
  const head = frames.length ? ["Stack (your code, most recent call first):", ...frames] : [];
  return [...head, describeError(err)].join("\n") + "\n";
}

function sourceLine(file, lineNo) {
  try {
    return (fs.readFileSync(file, "utf8").split("\n")[lineNo - 1] ?? "").trim();
  } catch {
    return "";
  }
}
