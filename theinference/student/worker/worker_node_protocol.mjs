// The wire protocol as the Node worker reads it: protocol.json beside this file (the one the
// Python worker and the grader read), and the framing it states, on the two private pipes.

import fs from "node:fs";

export const PROTOCOL = JSON.parse(fs.readFileSync(new URL("./protocol.json", import.meta.url), "utf8"));
export const LIMITS = PROTOCOL.limits;
const BLOB_SIZES = PROTOCOL.framing.blob_sizes;

// The framing's struct formats, as Node reads and writes them: little-endian only
const FIELDS = {
  "<Q": { size: 8, read: (b, at) => Number(b.readBigUInt64LE(at)), write: (b, v, at) => b.writeBigUInt64LE(BigInt(v), at) },
  "<I": { size: 4, read: (b, at) => b.readUInt32LE(at), write: (b, v, at) => b.writeUInt32LE(v, at) },
};
const LENGTH = fieldOf(PROTOCOL.framing.length);
const HEADER_LENGTH = fieldOf(PROTOCOL.framing.header_length);

function fieldOf(format) {
  if (!FIELDS[format]) throw new Error(`protocol.json: a framing format Node does not know: ${format}`);
  return FIELDS[format];
}

let reqFd = -1, respFd = -1;

export function openPipes(requests, replies) {
  [reqFd, respFd] = [requests, replies];
}

function readExactly(n) {
  const buf = Buffer.alloc(n);
  let got = 0;
  while (got < n) {
    let read;
    try {
      read = fs.readSync(reqFd, buf, got, n - got, null);
    } catch (err) {
      if (err.code === "EAGAIN") continue;
      if (err.code === "EOF") return null;
      throw err;
    }
    if (read === 0) return null;
    got += read;
  }
  return buf;
}

const UTF8 = new TextDecoder("utf-8", { fatal: true });

// The grader's next message (its length, then a JSON object), or null when it has gone (even
// mid-message). One that is not a JSON object ends the worker (protocol.json: malformed_exit).
export function readMessage() {
  const prefix = readExactly(LENGTH.size);
  if (!prefix) return null;
  const body = readExactly(LENGTH.read(prefix, 0));
  if (!body) return null;
  let message = null;
  try {
    message = JSON.parse(UTF8.decode(body));
  } catch {
    // not JSON, or not UTF-8
  }
  if (message === null || typeof message !== "object" || Array.isArray(message)) malformed();
  return message;
}

// The next call asked for (readMessage's), which names an adapter and gives its arguments as a
// list, or the worker ends as on a message that is not JSON
export function readRequest() {
  const request = readMessage();
  if (request !== null && !(typeof request.adapter === "string" && Array.isArray(request.args))) malformed();
  return request;
}

function malformed() {
  process.exit(PROTOCOL.framing.malformed_exit);
}

// A frame as replies have it (JSON, then raw blobs, each an ArrayBuffer): a hook's answer from
// the grader.
// An empty answer when the grader has gone.
export function readFrame() {
  const prefix = readExactly(LENGTH.size + HEADER_LENGTH.size);
  if (!prefix) return [{}, []];
  const size = LENGTH.read(prefix, 0), textLen = HEADER_LENGTH.read(prefix, LENGTH.size);
  const body = readExactly(size - HEADER_LENGTH.size);
  if (!body) return [{}, []];
  const header = JSON.parse(body.subarray(0, textLen).toString("utf8"));
  const blobs = [];
  let at = textLen;
  for (const n of header[BLOB_SIZES] ?? []) {
    blobs.push(body.buffer.slice(body.byteOffset + at, body.byteOffset + at + n));
    at += n;
  }
  return [header, blobs];
}

export function writeMessage(header, blobs) {
  const text = Buffer.from(JSON.stringify({ ...header, [BLOB_SIZES]: blobs.map((b) => b.length) }));
  const prefix = Buffer.alloc(LENGTH.size + HEADER_LENGTH.size);
  LENGTH.write(prefix, HEADER_LENGTH.size + text.length + blobs.reduce((a, b) => a + b.length, 0), 0);
  HEADER_LENGTH.write(prefix, text.length, LENGTH.size);
  for (const chunk of [prefix, text, ...blobs]) {
    let off = 0;
    while (off < chunk.length) off += fs.writeSync(respFd, chunk, off, chunk.length - off);
  }
}
