// Builds the inspector into ui/dist/: one script and one stylesheet bundled by esbuild straight
// from the TypeScript sources (and the SDK's), each named by a hash of its bytes, plus index.html
// naming them. The output depends only on the sources and the pinned esbuild, so a rebuild of an
// unchanged tree gives the same bytes; `--check` rebuilds in memory and fails if ui/dist/ differs
// (CI runs it). Usage: node build.mjs [--check] [--out DIR]
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const check = args.includes("--check");
const outIndex = args.indexOf("--out");
const outDir = resolve(outIndex >= 0 ? args[outIndex + 1] : join(here, "dist"));

// The SDK is bundled from its TypeScript source (never from a build of it), so a change there
// shows up here as a changed bundle: an import of `acp-http-client` or `sandbox-agent` (or one of
// their subpaths) resolves through that package's `exports` map, `./dist/X.js` read as
// `./src/X.ts`. The SDK's own dependencies always resolve to ui/node_modules (pinned in
// ui/package-lock.json), whether or not sdks/typescript/node_modules exists, so the output does
// not depend on what else is installed.
const sdkPackages = join(here, "..", "sdks", "typescript", "packages");
const sdkSource = {
  name: "sdk-source",
  setup(b) {
    b.onResolve({ filter: /^(acp-http-client|sandbox-agent)(\/.*)?$/ }, (args) => {
      const [, name, sub = ""] = /^([^/]+)(\/.*)?$/.exec(args.path);
      const pkg = JSON.parse(readFileSync(join(sdkPackages, name, "package.json"), "utf8"));
      const target = pkg.exports?.[`.${sub}`]?.import;
      const src = typeof target === "string" && /^\.\/dist\/(.+)\.js$/.exec(target);
      if (!src) return { errors: [{ text: `${args.path}: not an export of ${name}` }] };
      return { path: join(sdkPackages, name, "src", `${src[1]}.ts`) };
    });
  },
};
const alias = {
  "@agentclientprotocol/sdk": join(here, "node_modules", "@agentclientprotocol", "sdk"),
  zod: join(here, "node_modules", "zod"),
};

const common = {
  bundle: true,
  write: false,
  minify: true,
  legalComments: "none",
  charset: "utf8",
  target: ["es2022", "chrome110", "firefox115", "safari16"],
  logLevel: "warning",
  absWorkingDir: here,
  nodePaths: [join(here, "node_modules")],
  alias,
  plugins: [sdkSource],
  // The TypeScript settings that shape the output, given here instead of read from the
  // tsconfig.json files: esbuild 0.28 applied those of the SDK packages (whose `strict` decides a
  // `"use strict"` directive) to their sources only in some builds (about 1 in 20 here, more
  // under load), so the same tree gave two different bundles. Both tsconfigs agree on these.
  tsconfigRaw: { compilerOptions: { strict: true, useDefineForClassFields: true } },
};

const hashName = (stem, ext, bytes) =>
  `${stem}-${createHash("sha256").update(bytes).digest("hex").slice(0, 12)}.${ext}`;

async function bundle(entry, loader) {
  const result = await esbuild.build({ ...common, entryPoints: [join(here, entry)], ...loader });
  if (result.outputFiles.length !== 1) throw new Error(`${entry}: expected one output file`);
  return Buffer.from(result.outputFiles[0].contents);
}

const js = await bundle("src/main.ts", { format: "iife", platform: "browser" });
const css = await bundle("src/style.css", {});
const icon = readFileSync(join(here, "src/icon.svg"));

const files = new Map();
const jsName = hashName("app", "js", js);
const cssName = hashName("app", "css", css);
const iconName = hashName("icon", "svg", icon);
files.set(jsName, js);
files.set(cssName, css);
files.set(iconName, icon);
const template = readFileSync(join(here, "src/index.html"), "utf8");
const html = template
  .replaceAll("{{app.js}}", jsName)
  .replaceAll("{{app.css}}", cssName)
  .replaceAll("{{icon.svg}}", iconName);
if (html.includes("{{")) throw new Error("src/index.html names an asset build.mjs does not make");
files.set("index.html", Buffer.from(html));

if (check) {
  const present = existsSync(outDir) ? readdirSync(outDir) : [];
  const problems = [];
  for (const [name, bytes] of files) {
    if (!present.includes(name)) problems.push(`missing ${name}`);
    else if (!readFileSync(join(outDir, name)).equals(bytes)) problems.push(`differs ${name}`);
  }
  for (const name of present) if (!files.has(name)) problems.push(`stale ${name}`);
  if (problems.length) {
    console.error(`ui/dist is not the build of ui/src (run \`npm run build\` in ui/):\n  ${problems.join("\n  ")}`);
    process.exit(1);
  }
  console.log(`ui/dist matches a fresh build (${files.size} files)`);
} else {
  mkdirSync(outDir, { recursive: true });
  for (const name of readdirSync(outDir)) if (!files.has(name)) rmSync(join(outDir, name));
  for (const [name, bytes] of files) writeFileSync(join(outDir, name), bytes);
  const total = [...files.values()].reduce((n, b) => n + b.length, 0);
  console.log(`built ${files.size} files (${total} bytes) into ${outDir}`);
}
