// Unit tests of the inspector's pure cores (the line diff, content-block text, size formatting),
// run with `node --test test/unit.test.mjs`. The TypeScript modules are bundled in memory by the
// pinned esbuild and imported from a data: URL, so nothing is written to disk.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as esbuild from "esbuild";

async function load(entry) {
  const out = await esbuild.build({
    entryPoints: [new URL(`../src/${entry}`, import.meta.url).pathname],
    bundle: true,
    format: "esm",
    platform: "neutral",
    write: false,
    logLevel: "silent",
  });
  const code = out.outputFiles[0].text;
  return import(`data:text/javascript;base64,${Buffer.from(code).toString("base64")}`);
}

const { lineDiff } = await load("diff.ts");
const { contentText } = await load("transcript.ts");
const { bytes } = await load("dom.ts");
const { Series, points } = await load("spark.ts");

test("sparkline series: memory samples, CPU as cores between samples, bounded history", () => {
  const s = new Series(3);
  s.push(1000, 100, 0);
  s.push(2000, 200, 500);
  s.push(2000, 999, 999); // not later: ignored
  s.push(3000, null, 1500);
  s.push(4000, 400, 1500);
  assert.deepEqual(s.memory(), [200, 400], "the oldest sample fell out; a missing figure is skipped");
  assert.deepEqual(s.cpu(), [1, 0]);
});

test("sparkline points scale to the box, the maximum at the top", () => {
  assert.equal(points([0, 5, 10], 80, 20), "0.0,20.0 40.0,10.0 80.0,0.0");
  assert.equal(points([1], 80, 20), "");
  assert.equal(points([0, 0], 80, 20, 0.5), "0.0,20.0 80.0,20.0");
});

/** `expected` in a compact form: "+x" added, "-x" removed, " x" unchanged. */
function check(oldText, newText, expected) {
  const got = lineDiff(oldText, newText).map((l) => (l.op === "add" ? "+" : l.op === "del" ? "-" : " ") + l.text);
  assert.deepEqual(got, expected, `${JSON.stringify(oldText)} → ${JSON.stringify(newText)}`);
}

test("line diff", () => {
  check("", "", []);
  check("", "a\nb", ["+a", "+b"]);
  check("a\nb", "", ["-a", "-b"]);
  check("a\nb\nc", "a\nb\nc", [" a", " b", " c"]);
  check("a\nb\nc", "a\nx\nc", [" a", "-b", "+x", " c"]);
  check("a\nb\nc\nd", "a\nc\nd\ne", [" a", "-b", " c", " d", "+e"]);
  check("x\na\nb", "a\nb\ny", ["-x", " a", " b", "+y"]);
});

test("line diff beyond the table bound stays correct", () => {
  const old = Array.from({ length: 1500 }, (_, i) => `o${i}`).join("\n");
  const neu = Array.from({ length: 1500 }, (_, i) => `n${i}`).join("\n");
  const d = lineDiff(`same\n${old}\nend`, `same\n${neu}\nend`);
  assert.equal(d[0].op, "same");
  assert.equal(d.at(-1).op, "same");
  assert.equal(d.filter((l) => l.op === "del").length, 1500);
  assert.equal(d.filter((l) => l.op === "add").length, 1500);
});

test("content block text", () => {
  const cases = [
    [{ type: "text", text: "hi" }, "hi"],
    [{ type: "image", mimeType: "image/png", data: "…" }, "[image image/png]"],
    [{ type: "resource_link", name: "spec", uri: "file:///a" }, "[spec: file:///a]"],
    [{ type: "resource", resource: { uri: "file:///b", text: "body" } }, "body"],
    [{ type: "resource", resource: { uri: "file:///c", blob: "…" } }, "[resource file:///c]"],
    [{ type: "new-kind", x: 1 }, '{\n  "type": "new-kind",\n  "x": 1\n}'],
  ];
  for (const [block, expected] of cases) assert.equal(contentText(block), expected);
});

test("sizes for people", () => {
  const cases = [
    [0, "0 B"],
    [1023, "1023 B"],
    [1024, "1.0 KiB"],
    [1536, "1.5 KiB"],
    [10 * 1024 * 1024, "10 MiB"],
    [null, "–"],
  ];
  for (const [n, expected] of cases) assert.equal(bytes(n), expected);
});
