// Claude Code (`claude -p`, print mode) and Codex CLI (`codex exec`), installed from npm and
// unmodified, against `deltafin serve` (started by tests/api_clients_test.cpp with
// DELTAFIN_BASE_URL, DELTAFIN_API_KEY and DELTAFIN_EXPECT: the answer the server was scripted to
// give). Each runs offline in a scratch HOME as docs/SERVER.md's recipes say, must exit 0 and
// must print the answer. Their prompts are long (tens of thousands of tokens with the test
// model's byte-level vocabulary): the server's model has a context that holds them.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const base = process.env.DELTAFIN_BASE_URL;
const key = process.env.DELTAFIN_API_KEY || "unused";
const expect = process.env.DELTAFIN_EXPECT;
const only = process.env.DELTAFIN_AGENT;  // "claude" or "codex": run one
const bin = (name) => path.join(path.dirname(new URL(import.meta.url).pathname), "node_modules", ".bin", name);
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "deltafin-agents-"));
let failed = false;

function run(name, cmd, args, env) {
  const home = path.join(scratch, name);
  const work = path.join(home, "work");
  fs.mkdirSync(work, { recursive: true });
  const t0 = Date.now();
  const r = spawnSync(cmd, args, {
    cwd: work,
    env: { PATH: process.env.PATH, HOME: home, ...env(home) },
    input: "",
    encoding: "utf8",
    timeout: 900_000,
  });
  const ok = r.status === 0 && r.stdout.includes(expect);
  console.log(`${name}: exit ${r.status}${r.signal ? ` (${r.signal})` : ""} in ${((Date.now() - t0) / 1000).toFixed(1)} s; ` +
    `stdout ${JSON.stringify(r.stdout.slice(-300))}${ok ? "" : `\nstderr: ${r.stderr.slice(-2000)}`}`);
  failed ||= !ok;
}

if (!only || only === "claude") {
  run("claude", bin("claude"), ["-p", "Say hello.", "--model", "kimi-k3"], () => ({
    ANTHROPIC_BASE_URL: base,
    ANTHROPIC_API_KEY: key,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    DISABLE_AUTOUPDATER: "1",
  }));
}
if (!only || only === "codex") {
  run("codex", bin("codex"), ["exec", "--skip-git-repo-check", "Say hello."], (home) => {
    const codexHome = path.join(home, ".codex");
    fs.mkdirSync(codexHome, { recursive: true });
    fs.writeFileSync(path.join(codexHome, "config.toml"),
      `model = "kimi-k3"\nmodel_provider = "deltafin"\n\n[model_providers.deltafin]\n` +
      `name = "Deltafin"\nbase_url = "${base}/v1"\nwire_api = "responses"\nenv_key = "DELTAFIN_API_KEY"\n`);
    return { CODEX_HOME: codexHome, DELTAFIN_API_KEY: key };
  });
}
fs.rmSync(scratch, { recursive: true, force: true });
if (failed) process.exit(1);
console.log("agent clients: all checks passed");
