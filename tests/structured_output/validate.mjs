// Validates generated instances against their schemas with ajv (draft 2020-12, ajv-formats in
// full mode): an implementation independent of Deltafin's schema compiler. Input: a JSON Lines
// file of {"id", "schema", "instance"} (argv[2]). Prints each failure and a summary; exits 1 if
// any instance is invalid.
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv, { mode: "full" });
const cache = new Map();
let checked = 0, failed = 0;
for (const line of readFileSync(process.argv[2], "utf8").split("\n")) {
  if (!line.trim()) continue;
  const { id, schema, instance } = JSON.parse(line);
  const key = JSON.stringify(schema);
  if (!cache.has(key)) cache.set(key, ajv.compile(schema));
  const validate = cache.get(key);
  checked++;
  if (!validate(instance)) {
    failed++;
    console.log(`FAIL ${id}: ${JSON.stringify(instance)} ${ajv.errorsText(validate.errors)}`);
  }
}
console.log(`checked ${checked}, failed ${failed}`);
process.exit(failed === 0 && checked > 0 ? 0 : 1);
