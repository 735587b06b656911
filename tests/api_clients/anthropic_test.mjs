// The official Anthropic SDK against `deltafin serve` (started by tests/api_clients_test.cpp with
// DELTAFIN_BASE_URL and DELTAFIN_API_KEY): messages.create, messages.stream (text and thinking,
// with the raw event order checked), a tool_result round trip that must prompt the model exactly
// as the equivalent Chat Completions conversation does, countTokens, the error envelope, and a
// truncated image refused naming its block.
import Anthropic from "@anthropic-ai/sdk";
import { base, chat, check, failOnClientWarnings, key, truncatedPng } from "./common.mjs";

failOnClientWarnings();
const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 60000 });
const ask = { model: "kimi-k3", max_tokens: 6, temperature: 0, messages: [{ role: "user", content: "Say hello." }] };

const msg = await client.messages.create(ask);
check(msg.type === "message" && msg.role === "assistant" && msg.id.startsWith("msg_"), "message shape");
check(msg.content.length === 1 && msg.content[0].type === "text", `one text block (${JSON.stringify(msg.content)})`);
check(["end_turn", "max_tokens"].includes(msg.stop_reason), `stop_reason ${msg.stop_reason}`);
check(msg.usage.output_tokens > 0 && msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 0, "usage");

// Streamed: the same greedy text, and the event order the SDK's accumulator relies on.
const stream = client.messages.stream(ask);
let streamed = "";
stream.on("text", (t) => (streamed += t));
const final = await stream.finalMessage();
check(streamed === msg.content[0].text, `streamed text equals the message (${JSON.stringify(streamed)})`);
check(final.usage.output_tokens === msg.usage.output_tokens && final.stop_reason === msg.stop_reason, "stream usage and stop");

function checkOrder(events) {
  check(events[0].type === "message_start", "message_start first");
  check(events.at(-1).type === "message_stop" && events.at(-2).type === "message_delta", "message_delta, message_stop last");
  let open = -1, next = 0;
  for (const e of events.slice(1, -2)) {
    if (e.type === "content_block_start") { check(open === -1 && e.index === next, "block start in order"); open = next++; }
    else if (e.type === "content_block_delta") check(e.index === open, "delta of the open block");
    else if (e.type === "content_block_stop") { check(e.index === open, "stop of the open block"); open = -1; }
    else check(false, `unexpected event ${e.type}`);
  }
  check(open === -1, "every block stopped");
}

const thinkAsk = { ...ask, max_tokens: 8, thinking: { type: "enabled", budget_tokens: 1024 } };
const raw = await client.messages.create({ ...thinkAsk, stream: true });
const events = [];
for await (const e of raw) events.push(e);
checkOrder(events);
const thinking = client.messages.stream(thinkAsk);
let thought = "";
thinking.on("thinking", (t) => (thought += t));
const withThinking = await thinking.finalMessage();
check(withThinking.content[0].type === "thinking" && withThinking.content[0].thinking === thought && thought.length > 0,
  `a thinking block first (${JSON.stringify(withThinking.content)})`);

// A tool_use / tool_result round trip: same prompt (token count and greedy answer) as the
// equivalent Chat Completions conversation.
const tools = [{ name: "get_weather", description: "Weather for a city", input_schema: { type: "object", properties: { city: { type: "string" } } } }];
const conversation = [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: [{ type: "text", text: "Checking." }, { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
  { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "sunny" }, { type: "text", text: "Thanks." }] },
];
const round = await client.messages.create({ model: "kimi-k3", max_tokens: 5, temperature: 0, system: "Be brief.", tools, messages: conversation });
const same = await chat({
  model: "kimi-k3", max_tokens: 5, temperature: 0, thinking: false,
  tools: [{ type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: tools[0].input_schema } }],
  messages: [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: "Checking.", tool_calls: [{ id: "toolu_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
    { role: "tool", tool_call_id: "toolu_1", content: "sunny" },
    { role: "user", content: "Thanks." },
  ],
});
const roundInput = round.usage.input_tokens + round.usage.cache_read_input_tokens;
check(roundInput === same.usage.prompt_tokens, `tool round trip prompt: ${roundInput} vs chat ${same.usage.prompt_tokens} tokens`);
check(round.content.map((b) => b.text ?? "").join("") === (same.choices[0].message.content ?? ""), "tool round trip: same greedy answer");

const counted = await client.messages.countTokens({ model: "kimi-k3", system: "Be brief.", tools, messages: conversation });
check(counted.input_tokens === roundInput, `countTokens ${counted.input_tokens} vs ${roundInput}`);

// Errors: Anthropic's envelope and status classes.
try {
  await client.messages.create({ ...ask, model: "no-such-model" });
  check(false, "an unknown model is refused");
} catch (e) {
  check(e instanceof Anthropic.NotFoundError && e.status === 404, `NotFoundError (got ${e})`);
  check(e.error?.type === "error" && e.error?.error?.type === "not_found_error", `envelope ${JSON.stringify(e.error)}`);
}
try {
  await client.messages.create({ model: "kimi-k3", messages: ask.messages });
  check(false, "max_tokens is required");
} catch (e) {
  check(e instanceof Anthropic.BadRequestError && e.error?.error?.type === "invalid_request_error", `BadRequestError (got ${e})`);
}
try {
  await client.messages.create({ ...ask, messages: [{ role: "user", content: [
    { type: "image", source: { type: "base64", media_type: "image/png", data: truncatedPng } },
    { type: "text", text: "What is this?" }] }] });
  check(false, "a truncated image is refused");
} catch (e) {
  check(e instanceof Anthropic.BadRequestError && /^messages\[0\]\.content\[0\]\.source: .*(truncated|this model is text only)/.test(e.error?.error?.message),
    `a truncated image: 400 naming the block (got ${e})`);
}
if (process.env.DELTAFIN_API_KEY) {
  const wrong = new Anthropic({ baseURL: base, apiKey: "wrong", maxRetries: 0 });
  try {
    await wrong.messages.create(ask);
    check(false, "a wrong key is refused");
  } catch (e) {
    check(e instanceof Anthropic.AuthenticationError && e.error?.error?.type === "authentication_error", `AuthenticationError (got ${e})`);
  }
  // The key as a bearer token (ANTHROPIC_AUTH_TOKEN) is accepted too.
  const bearer = new Anthropic({ baseURL: base, apiKey: null, authToken: key, maxRetries: 0 });
  check((await bearer.messages.create(ask)).content[0].text === msg.content[0].text, "bearer token accepted");
}
console.log("anthropic client: all checks passed");
