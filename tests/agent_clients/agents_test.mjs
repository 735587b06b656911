// Claude Code (`claude -p`, print mode) and Codex CLI (`codex exec`), installed from npm and
// unmodified, against `deltafin serve` (started by tests/api_clients_test.cpp with
// DELTAFIN_BASE_URL, DELTAFIN_API_KEY and DELTAFIN_EXPECT: the answer the server was scripted to
// give). Each runs offline in a scratch HOME as docs/SERVER.md's recipes say, must exit 0 and
// must print the answer. Their prompts are long (tens of thousands of tokens with the test
// model's byte-level vocabulary): the server's model has a context that holds them.
// With DELTAFIN_IMAGE (a file) and DELTAFIN_IMAGE_TOKENS (its <|media_pad|> count under the
// server model's preprocessor), each agent sends that image the way its users attach one:
// Claude Code in print mode reads a stream-json user message with an `image` block (base64) on
// stdin, Codex gets `exec --image FILE`. Exiting 0 with the answer is not enough: the server's
// /metrics must count the image in the prompts it ran (at least one image, and exactly
// DELTAFIN_IMAGE_TOKENS tokens per image: the image reached the prompt whole).
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";

const base = process.env.DELTAFIN_BASE_URL;
const key = process.env.DELTAFIN_API_KEY || "unused";
const expect = process.env.DELTAFIN_EXPECT;
const only = process.env.DELTAFIN_AGENT;  // "claude" or "codex": run one
const image = process.env.DELTAFIN_IMAGE;
const imageTokens = Number(process.env.DELTAFIN_IMAGE_TOKENS);
const bin = (name) => path.join(path.dirname(new URL(import.meta.url).pathname), "node_modules", ".bin", name);
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "deltafin-agents-"));
let failed = false;

// /metrics on a connection of its own: an agent runs for minutes in between, long enough for
// the server to close an idle kept-alive socket that fetch would reuse (EPIPE).
function imageCounters() {
  return new Promise((resolve, reject) => {
    const req = http.get(`${base}/metrics`, { agent: false, headers: { authorization: `Bearer ${key}` } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (text += c));
      res.on("end", () => {
        if (res.statusCode !== 200) return reject(new Error(`/metrics answered ${res.statusCode}`));
        const get = (n) => Number((text.match(new RegExp(`^${n} (\\S+)$`, "m")) || [])[1]);
        resolve({ images: get("deltafin_vision_prompt_images_total"), tokens: get("deltafin_vision_prompt_image_tokens_total") });
      });
    });
    req.on("error", reject);
    req.setTimeout(60_000, () => req.destroy(new Error("/metrics did not answer in 60 s")));
  });
}

async function run(name, cmd, args, env, input = "") {
  const before = image ? await imageCounters() : null;
  const home = path.join(scratch, name);
  const work = path.join(home, "work");
  fs.mkdirSync(work, { recursive: true });
  const t0 = Date.now();
  const r = spawnSync(cmd, args, {
    cwd: work,
    env: { PATH: process.env.PATH, HOME: home, ...env(home) },
    input,
    encoding: "utf8",
    timeout: 900_000,
  });
  const ok = r.status === 0 && r.stdout.includes(expect);
  console.log(`${name}: exit ${r.status}${r.signal ? ` (${r.signal})` : ""} in ${((Date.now() - t0) / 1000).toFixed(1)} s; ` +
    `stdout ${JSON.stringify(r.stdout.slice(-300))}${ok ? "" : `\nstderr: ${r.stderr.slice(-2000)}`}`);
  failed ||= !ok;
  if (image) {
    const after = await imageCounters();
    const images = after.images - before.images, tokens = after.tokens - before.tokens;
    const seen = images >= 1 && tokens === images * imageTokens;
    console.log(`${name}: the server's prompts held ${images} image(s), ${tokens} image tokens ` +
      `(expected ${imageTokens} per image)${seen ? "" : ": the image did not reach the prompt whole"}`);
    failed ||= !seen;
  }
}

const claudeEnv = () => ({
  ANTHROPIC_BASE_URL: base,
  ANTHROPIC_API_KEY: key,
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
  DISABLE_AUTOUPDATER: "1",
});
if ((!only || only === "claude") && !image) {
  await run("claude", bin("claude"), ["-p", "Say hello.", "--model", "kimi-k3"], claudeEnv);
}
if ((!only || only === "claude") && image) {
  // One user message as print mode's stream-json input reads it (the Messages API's content
  // blocks), then end of input.
  const message = { type: "user", message: { role: "user", content: [
    { type: "image", source: { type: "base64", media_type: "image/jpeg", data: fs.readFileSync(image).toString("base64") } },
    { type: "text", text: "Say hello." }] } };
  await run("claude", bin("claude"), ["-p", "--input-format", "stream-json", "--output-format", "stream-json",
    "--verbose", "--model", "kimi-k3"], claudeEnv, JSON.stringify(message) + "\n");
}
if (!only || only === "codex") {
  const args = ["exec", "--skip-git-repo-check", "Say hello."];
  if (image) args.push("--image", image);  // after the prompt: --image takes several values
  await run("codex", bin("codex"), args, (home) => {
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
