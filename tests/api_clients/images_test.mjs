// An image through each official client against `deltafin serve` with no --model (the built-in
// demo, whose vision tower is random: it cannot say what the picture shows, but the whole path
// runs), started by tests/api_clients_test.cpp with DELTAFIN_IMAGE (a JPEG file) and
// DELTAFIN_IMAGE_TOKENS (its <|media_pad|> count under the demo's preprocessor, from the
// engine's own plan). Each client sends the image the way its users do: OpenAI chat an
// `image_url` part with a data: URL (also streamed), Responses an `input_image`, Anthropic an
// `image` block with base64 source, Ollama an `images` string. An answer alone would not show
// the image was used, so each request is checked on the server's side too: /metrics counts one
// prompt image of exactly DELTAFIN_IMAGE_TOKENS tokens per request, and the prompt is longer than
// the same request without the image by at least that many tokens. Each client asks a question
// of its own, so no request's prompt is a kept prefix of another's.
import fs from "node:fs";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { Ollama } from "ollama";
import { base, check, failOnClientWarnings, key } from "./common.mjs";

failOnClientWarnings();
const file = process.env.DELTAFIN_IMAGE;
const tokens = Number(process.env.DELTAFIN_IMAGE_TOKENS);
check(file && Number.isInteger(tokens) && tokens > 0, "DELTAFIN_IMAGE and DELTAFIN_IMAGE_TOKENS are set");
const b64 = fs.readFileSync(file).toString("base64");
const dataUrl = `data:image/jpeg;base64,${b64}`;

async function metrics() {
  const r = await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${key}` } });
  check(r.ok, `/metrics answered ${r.status}`);
  const text = await r.text();
  const get = (name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, "m"));
    check(m, `/metrics has ${name}`);
    return Number(m[1]);
  };
  return { images: get("deltafin_vision_prompt_images_total"), tokens: get("deltafin_vision_prompt_image_tokens_total"),
           encoded: get("deltafin_vision_images_encoded_total") };
}

// One client's request with the image and the same request without it, each returning
// {text, prompt, completion}.
async function sees(name, withImage, withoutImage) {
  const before = await metrics();
  const a = await withImage();
  const mid = await metrics();
  check(mid.images === before.images + 1 && mid.tokens === before.tokens + tokens && mid.encoded === before.encoded + 1,
    `${name}: the server encoded one image of ${tokens} tokens (before ${JSON.stringify(before)}, after ${JSON.stringify(mid)})`);
  const b = await withoutImage();
  const after = await metrics();
  check(after.images === mid.images, `${name}: the text-only request has no image`);
  check(typeof a.text === "string" && a.completion > 0, `${name}: an answer (${JSON.stringify(a)})`);
  check(a.prompt >= b.prompt + tokens,
    `${name}: the image's ${tokens} tokens are in the prompt (${a.prompt} prompt tokens, ${b.prompt} without the image)`);
  console.log(`${name}: ${a.prompt} prompt tokens (${b.prompt} without the image), answered ${JSON.stringify(a.text)}`);
}

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const chatAsk = (content) => ({ model: "kimi-k3", messages: [{ role: "user", content }], max_tokens: 6, temperature: 0 });
const chatOut = (r) => ({ text: r.choices[0].message.content ?? "", prompt: r.usage.prompt_tokens, completion: r.usage.completion_tokens });
const openaiQ = "What is in this picture?";
const openaiParts = [{ type: "text", text: openaiQ }, { type: "image_url", image_url: { url: dataUrl, detail: "low" } }];
await sees("openai chat",
  async () => chatOut(await openai.chat.completions.create(chatAsk(openaiParts))),
  async () => chatOut(await openai.chat.completions.create(chatAsk(openaiQ))));
// Streamed, the same greedy answer over the same prompt (now a kept prefix: nothing encoded).
const whole = await openai.chat.completions.create(chatAsk(openaiParts));
let streamed = "", usage = null;
for await (const c of await openai.chat.completions.create({ ...chatAsk(openaiParts), stream: true, stream_options: { include_usage: true } })) {
  streamed += c.choices[0]?.delta?.content ?? "";
  if (c.usage) usage = c.usage;
}
check(streamed === (whole.choices[0].message.content ?? ""), `streamed answer equals the whole one (${JSON.stringify(streamed)})`);
check(usage && usage.prompt_tokens === whole.usage.prompt_tokens, "streamed usage counts the image");

const respAsk = (content) => ({ model: "kimi-k3", input: [{ role: "user", content }], max_output_tokens: 6, temperature: 0, reasoning: { effort: "none" } });
const respOut = (r) => ({ text: r.output_text, prompt: r.usage.input_tokens, completion: r.usage.output_tokens });
const respQ = "Describe this image.";
await sees("openai responses",
  async () => respOut(await openai.responses.create(respAsk([{ type: "input_image", image_url: dataUrl, detail: "auto" }, { type: "input_text", text: respQ }]))),
  async () => respOut(await openai.responses.create(respAsk([{ type: "input_text", text: respQ }]))));

const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const msgAsk = (content) => ({ model: "kimi-k3", max_tokens: 6, temperature: 0, messages: [{ role: "user", content }] });
const msgOut = (m) => ({ text: m.content.filter((b) => b.type === "text").map((b) => b.text).join(""),
  prompt: m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0), completion: m.usage.output_tokens });
const anthropicQ = "What do you see here?";
await sees("anthropic messages",
  async () => msgOut(await anthropic.messages.create(msgAsk([
    { type: "image", source: { type: "base64", media_type: "image/jpeg", data: b64 } }, { type: "text", text: anthropicQ }]))),
  async () => msgOut(await anthropic.messages.create(msgAsk([{ type: "text", text: anthropicQ }]))));

const ollama = new Ollama({ host: base, headers: { Authorization: `Bearer ${key}` } });
const olAsk = (message) => ({ model: "kimi-k3", messages: [{ role: "user", ...message }], think: false, stream: false, options: { temperature: 0, num_predict: 6 } });
const olOut = (r) => ({ text: r.message.content, prompt: r.prompt_eval_count, completion: r.eval_count });
const ollamaQ = "Look at this photo: what is it?";
await sees("ollama chat",
  async () => olOut(await ollama.chat(olAsk({ content: ollamaQ, images: [b64] }))),
  async () => olOut(await ollama.chat(olAsk({ content: ollamaQ }))));

console.log("image clients: all checks passed");
