// The four official clients against `deltafin serve` over a K2-family or Kimi-Linear make-model,
// started by tests/server_util.cpp (expect_family_clients_reuse_state) with DELTAFIN_BASE_URL,
// DELTAFIN_API_KEY, DELTAFIN_MODEL (the served model id) and FAMILY_PHASE:
//   "calls"  the server's answers are scripted (DELTAFIN_DEBUG_SCRIPT) to one K2-format call of
//            get_weather, since a random model writes whitespace and further calls until its
//            token limit: each API hands the call back in its own shape (OpenAI tool_calls,
//            Anthropic tool_use, a Responses function_call item, Ollama message.tool_calls)
//            through the K2 output parser, under a forced tool_choice where the API has one;
//   "turns"  the model answers: each API gets a conversation holding a tool call and its result,
//            then the next turn (the answer sent back and one more user message), which must
//            prefill only what the client added plus the generation prompt (REUSE_CHECK=0: only
//            record the answers, for a server with --state-cache none).
//
// The reuse bound needs no copy of the K2 rendering: the second request's messages are the
// first's plus the additions, and the K2 formats put nothing after the messages but the
// generation prompt, so the prompt grows by exactly what was added and at most that plus the
// generation prompt may be prefilled (the snapshot sits at the end of the first request's
// messages). Ollama reports no prompt total, so there the additions (a plain assistant answer and
// a user message, which K2-Instruct, K2-Thinking and Kimi-Linear render alike) are counted with
// the server's /tokenize of their rendering (docs/FAMILY.md).
//
// "turns" prints one line "answers: [...]" for the C++ test to compare with a server that reuses
// nothing; both phases exit non-zero on the first failed check.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { Ollama } from "ollama";
import { base, check, failOnClientWarnings, key } from "./common.mjs";

failOnClientWarnings();
const phase = process.env.FAMILY_PHASE || "turns";
const checking = process.env.REUSE_CHECK !== "0";
const model = process.env.DELTAFIN_MODEL || "kimi-k2";
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const ollama = new Ollama({ host: base, headers: { Authorization: `Bearer ${key}` } });

// Token count of `text`, its K2 markers read as special tokens unless `special` is false (the
// way message contents are encoded: a marker a random model wrote as text stays text).
async function tokens(text, special = true) {
  const r = await fetch(`${base}/tokenize`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ content: text, parse_special: special }),
  });
  check(r.status === 200, `/tokenize answers 200 (got ${r.status})`);
  return (await r.json()).tokens.length;
}

check((await tokens("<|im_middle|>")) === 1, "the folder's tokenizer has K2's markers");
const params = {
  type: "object",
  properties: { city: { type: "string", enum: ["Paris", "Rome"] } },
  required: ["city"],
  additionalProperties: false,
};
const chatTools = [{ type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: params } }];
const anthropicTools = [{ name: "get_weather", description: "Weather for a city", input_schema: params }];
const responsesTools = [{ type: "function", name: "get_weather", description: "Weather for a city", parameters: params, strict: true }];

if (phase === "calls") {
  // The scripted answer: get_weather({"city":"Paris"}) in K2's tool-call section.
  const isParis = (args) => JSON.stringify(typeof args === "string" ? JSON.parse(args) : args) === '{"city":"Paris"}';
  const c = await openai.chat.completions.create({
    model, messages: [{ role: "user", content: "Weather in Paris?" }], tools: chatTools, max_tokens: 64,
    temperature: 0, tool_choice: { type: "function", function: { name: "get_weather" } },
  });
  const m = c.choices[0].message;
  check(c.choices[0].finish_reason === "tool_calls" && m.tool_calls?.length === 1 && m.tool_calls[0].type === "function" &&
    m.tool_calls[0].function.name === "get_weather" && isParis(m.tool_calls[0].function.arguments) && !m.content,
    `openai: one get_weather call (${JSON.stringify(c.choices[0])})`);
  const a = await anthropic.messages.create({
    model, max_tokens: 64, temperature: 0, tools: anthropicTools, messages: [{ role: "user", content: "Weather in Paris?" }],
    tool_choice: { type: "tool", name: "get_weather" },
  });
  check(a.stop_reason === "tool_use" && a.content.length === 1 && a.content[0].type === "tool_use" &&
    a.content[0].name === "get_weather" && isParis(a.content[0].input) && a.content[0].id.length > 0,
    `anthropic: one tool_use block (${JSON.stringify(a)})`);
  const r = await openai.responses.create({
    model, input: "Weather in Paris?", tools: responsesTools, max_output_tokens: 64, temperature: 0,
    tool_choice: { type: "function", name: "get_weather" },
  });
  check(r.output.length === 1 && r.output[0].type === "function_call" && r.output[0].name === "get_weather" &&
    isParis(r.output[0].arguments) && r.output[0].call_id.length > 0, `responses: one function_call item (${JSON.stringify(r.output)})`);
  const o = await ollama.chat({
    model, messages: [{ role: "user", content: "Weather in Paris?" }], tools: chatTools, think: false, stream: false,
    options: { temperature: 0, num_predict: 64 },
  });
  check(o.done && o.message.tool_calls?.length === 1 && o.message.tool_calls[0].function.name === "get_weather" &&
    isParis(o.message.tool_calls[0].function.arguments), `ollama: one tool call (${JSON.stringify(o.message)})`);
  let streamed = [];
  for await (const part of await ollama.chat({
    model, messages: [{ role: "user", content: "Weather in Paris?" }], tools: chatTools, think: false, stream: true,
    options: { temperature: 0, num_predict: 64 },
  })) streamed = streamed.concat(part.message.tool_calls ?? []);
  check(streamed.length === 1 && isParis(streamed[0].function.arguments), `ollama streamed: one tool call (${JSON.stringify(streamed)})`);
  console.log("family clients (calls): all checks passed");
  process.exit(0);
}

const GEN = await tokens("<|im_assistant|>assistant<|im_middle|>");
const answers = [];
const opts = { max_tokens: 6, temperature: 0 };

// The reuse check of a second turn from `prompt` (the whole prompt) and `cached` of each request.
function reused(what, first, second) {
  const added = second.prompt - first.prompt;
  const prefilled = second.prompt - second.cached;
  console.log(`${what}: prompt ${first.prompt} -> ${second.prompt}, cached ${second.cached}, ` +
    `prefilled ${prefilled}, added ${added} + ${GEN}`);
  if (!checking) return;
  check(added > 0, `${what}: the second prompt is longer`);
  check(prefilled <= added + GEN, `${what}: prefilled ${prefilled}, at most ${added} + ${GEN} expected`);
  check(second.cached >= first.prompt - GEN, `${what}: the first prompt's messages were reused`);
}

// OpenAI Chat Completions, with logit_bias keeping the model off the 256 special slots (K2's
// layout: <|im_user|> is the fourth after the ranks), one of which wins every row of the random
// head: its answers are then text that depends on the state they continue.
{
  const r = await fetch(`${base}/tokenize`, {
    method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ content: "<|im_user|>" }),
  });
  const ranks = (await r.json()).tokens[0] - 3;
  const bias = {};
  for (let id = ranks; id < ranks + 256; ++id) bias[id] = -100;
  const messages = [
    { role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: "", tool_calls: [{ id: "functions.get_weather:0", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
    { role: "tool", tool_call_id: "functions.get_weather:0", content: "sunny" },
  ];
  const r1 = await openai.chat.completions.create({ model, messages, tools: chatTools, ...opts, logit_bias: bias });
  const a1 = r1.choices[0].message.content ?? "";
  const turn2 = messages.concat([{ role: "assistant", content: a1 }, { role: "user", content: "And tomorrow?" }]);
  const r2 = await openai.chat.completions.create({ model, messages: turn2, tools: chatTools, ...opts, logit_bias: bias });
  reused("openai", { prompt: r1.usage.prompt_tokens },
    { prompt: r2.usage.prompt_tokens, cached: r2.usage.prompt_tokens_details?.cached_tokens ?? 0 });
  answers.push({ api: "openai", content: [a1, r2.choices[0].message.content ?? ""] });
}

// Anthropic Messages: tool_use and tool_result blocks.
{
  const messages = [
    { role: "user", content: "Weather in Rome?" },
    { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Rome" } }] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "rain" }] },
  ];
  const ask = { model, max_tokens: 6, temperature: 0, tools: anthropicTools };
  const r1 = await anthropic.messages.create({ ...ask, messages });
  const a1 = r1.content.map((b) => b.text ?? "").join("");
  const turn2 = messages.concat([{ role: "assistant", content: a1 }, { role: "user", content: "And tomorrow?" }]);
  const r2 = await anthropic.messages.create({ ...ask, messages: turn2 });
  const total = (u) => u.input_tokens + u.cache_read_input_tokens;
  reused("anthropic", { prompt: total(r1.usage) }, { prompt: total(r2.usage), cached: r2.usage.cache_read_input_tokens });
  answers.push({ api: "anthropic", content: [a1, r2.content.map((b) => b.text ?? "").join("")] });
}

// OpenAI Responses: function_call and function_call_output items.
{
  const input = [
    { role: "user", content: "Weather in Lyon?" },
    { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
    { type: "function_call_output", call_id: "call_1", output: "windy" },
  ];
  const ask = { model, tools: responsesTools, max_output_tokens: 6, temperature: 0 };
  const r1 = await openai.responses.create({ ...ask, input });
  const turn2 = input.concat([{ role: "assistant", content: r1.output_text }, { role: "user", content: "And tomorrow?" }]);
  const r2 = await openai.responses.create({ ...ask, input: turn2 });
  reused("responses", { prompt: r1.usage.input_tokens },
    { prompt: r2.usage.input_tokens, cached: r2.usage.input_tokens_details.cached_tokens });
  answers.push({ api: "responses", content: [r1.output_text, r2.output_text] });
}

// Ollama: tool_calls and a tool message.
{
  const messages = [
    { role: "user", content: "Weather in Nice?" },
    { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: { city: "Paris" } } }] },
    { role: "tool", content: "sunny" },
  ];
  const ask = { model, tools: chatTools, think: false, stream: false, options: { temperature: 0, num_predict: 6 } };
  const r1 = await ollama.chat({ ...ask, messages });
  check(r1.done && r1.message.role === "assistant" && r1.eval_count > 0, `ollama: an answer (${JSON.stringify(r1)})`);
  const text = "And tomorrow?";
  const turn2 = messages.concat([{ role: "assistant", content: r1.message.content }, { role: "user", content: text }]);
  const added = GEN + (await tokens(r1.message.content, false)) + (await tokens("<|im_end|>")) +
    (await tokens(`<|im_user|>user<|im_middle|>${text}<|im_end|>`));
  const r2 = await ollama.chat({ ...ask, messages: turn2 });
  console.log(`ollama: prompt_eval_count ${r1.prompt_eval_count} -> ${r2.prompt_eval_count}, added ${added} + ${GEN}`);
  if (checking) {
    check(r2.prompt_eval_count <= added + GEN, `ollama: prefilled ${r2.prompt_eval_count}, at most ${added} + ${GEN} expected`);
  }
  answers.push({ api: "ollama", content: [r1.message.content, r2.message.content] });
}

console.log("answers: " + JSON.stringify(answers));
console.log("family clients (turns): all checks passed");
