// The official OpenAI SDK's Responses API against `deltafin serve` (started by
// tests/api_clients_test.cpp): responses.create and responses.stream (message and reasoning
// items, sequence numbers and event order as the SDK's ResponseStream accumulates them), input
// with function_call / function_call_output items rendered exactly as the equivalent Chat
// Completions conversation, the error shape, and a truncated input_image refused naming the part.
import OpenAI from "openai";
import { base, chat, check, failOnClientWarnings, key, truncatedPng } from "./common.mjs";

failOnClientWarnings();
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const ask = { model: "kimi-k3", input: "Say hello.", max_output_tokens: 6, temperature: 0, reasoning: { effort: "none" } };

const r = await client.responses.create(ask);
check(r.object === "response" && r.id.startsWith("resp_"), "response shape");
check(r.output.length === 1 && r.output[0].type === "message" && r.output[0].content[0].type === "output_text", `one message item (${JSON.stringify(r.output)})`);
check(typeof r.output_text === "string" && r.output_text === r.output[0].content[0].text, "output_text");
check(r.status === "incomplete" ? r.incomplete_details.reason === "max_output_tokens" : r.status === "completed", `status ${r.status}`);
check(r.usage.output_tokens > 0 && r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, "usage");
check(typeof r.usage.input_tokens_details.cached_tokens === "number", "cached tokens reported");

function checkEvents(events) {
  check(events[0].type === "response.created" && events[1].type === "response.in_progress", "created, in_progress first");
  check(["response.completed", "response.incomplete"].includes(events.at(-1).type), `last: ${events.at(-1).type}`);
  events.forEach((e, i) => check(e.sequence_number === i, `sequence_number ${e.sequence_number} at ${i}`));
  const open = new Set();
  for (const e of events) {
    if (e.type === "response.output_item.added") open.add(e.output_index);
    if (e.type.endsWith(".delta")) check(open.has(e.output_index), `${e.type} of an open item`);
    if (e.type === "response.output_item.done") open.delete(e.output_index);
  }
  check(open.size === 0, "every item done");
}

const stream = client.responses.stream(ask);
const events = [];
let text = "";
stream.on("event", (e) => events.push(e));
stream.on("response.output_text.delta", (e) => (text += e.delta));
const final = await stream.finalResponse();
checkEvents(events);
check(text === r.output_text && final.output[0].content[0].text === text, `streamed text equals the response (${JSON.stringify(text)})`);
// (openai 4.x folds response.completed into finalResponse() but not response.incomplete: read
// the usage from the last event itself.)
check(events.at(-1).response.usage.output_tokens === r.usage.output_tokens, "stream usage");

// Reasoning on: the thinking channel comes back as a reasoning item with reasoning_text.
const thinking = client.responses.stream({ ...ask, max_output_tokens: 8, reasoning: { effort: "low" } });
const tevents = [];
let reasoning = "";
thinking.on("event", (e) => {
  tevents.push(e);
  if (e.type === "response.reasoning_text.delta") reasoning += e.delta;
});
await thinking.finalResponse();
checkEvents(tevents);
const tout = tevents.at(-1).response.output;
check(tout[0].type === "reasoning" && tout[0].content[0].text === reasoning && reasoning.length > 0,
  `a reasoning item first (${JSON.stringify(tout)})`);

// Function call items in the input: the same prompt as the Chat Completions conversation.
const tools = [{ type: "function", name: "get_weather", description: "Weather for a city", parameters: { type: "object", properties: { city: { type: "string" } } } }];
const input = [
  { role: "user", content: "Weather in Paris?" },
  { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
  { type: "function_call_output", call_id: "call_1", output: "sunny" },
];
const round = await client.responses.create({ model: "kimi-k3", input, tools, instructions: "Be brief.", max_output_tokens: 5, temperature: 0, reasoning: { effort: "none" } });
const same = await chat({
  model: "kimi-k3", max_tokens: 5, temperature: 0, thinking: false,
  tools: [{ type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: tools[0].parameters } }],
  messages: [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: "", tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny" },
  ],
});
check(round.usage.input_tokens === same.usage.prompt_tokens, `function call round trip: ${round.usage.input_tokens} vs chat ${same.usage.prompt_tokens}`);
check(round.output_text === (same.choices[0].message.content ?? ""), "function call round trip: same greedy answer");

try {
  await client.responses.create({ ...ask, model: "no-such-model" });
  check(false, "an unknown model is refused");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 404 && e.code === "model_not_found", `404 model_not_found (got ${e})`);
}
try {
  await client.responses.create({ ...ask, input: [{ role: "user", content: [{ type: "input_text", text: "What is this?" },
    { type: "input_image", image_url: `data:image/png;base64,${truncatedPng}`, detail: "auto" }] }] });
  check(false, "a truncated image is refused");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === "input[0].content[1].image_url" && /truncated|this model is text only/.test(e.message),
    `a truncated image: 400 naming the part (got ${e})`);
}
console.log("openai responses client: all checks passed");
