// The official OpenAI Node client against a running `deltafin serve`: lists models, chats plain
// and streamed, completes plain and streamed, and reads an error. Started by
// tests/server_test.cpp with DELTAFIN_BASE_URL and DELTAFIN_API_KEY set; exits non-zero with a
// message on the first mismatch, so the C++ test only checks the exit code and prints the output.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.DELTAFIN_BASE_URL,
  apiKey: process.env.DELTAFIN_API_KEY || "unused",
  maxRetries: 0,
  timeout: 60000,
});

function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
}

const models = await client.models.list();
const ids = models.data.map((m) => m.id);
check(ids.includes("kimi-k3"), `models lists kimi-k3 (got ${JSON.stringify(ids)})`);
const one = await client.models.retrieve("kimi-k3");
check(one.id === "kimi-k3" && one.object === "model", "models.retrieve");

const messages = [{ role: "user", content: "Say hello." }];
const chat = await client.chat.completions.create({
  model: "kimi-k3", messages, max_tokens: 4, temperature: 0, thinking: false,
});
check(chat.object === "chat.completion", "chat object");
check(chat.choices.length === 1 && chat.choices[0].message.role === "assistant", "chat message");
check(typeof chat.choices[0].message.content === "string", "chat content is a string");
check(["stop", "length"].includes(chat.choices[0].finish_reason), "chat finish_reason");
check(chat.usage.completion_tokens > 0 && chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens,
  "chat usage");

const stream = await client.chat.completions.create({
  model: "kimi-k3", messages, max_tokens: 4, temperature: 0, thinking: false, stream: true,
  stream_options: { include_usage: true },
});
let streamed = "";
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  check(chunk.object === "chat.completion.chunk", "chunk object");
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.content) streamed += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(chunks >= 2, "several chunks");
check(finish !== null, "stream finish_reason");
check(usage !== null && usage.completion_tokens === chat.usage.completion_tokens, "stream usage");
check(streamed === chat.choices[0].message.content, `streamed text equals the plain answer (${JSON.stringify(streamed)} vs ${JSON.stringify(chat.choices[0].message.content)})`);

const completion = await client.completions.create({ model: "kimi-k3", prompt: "Once upon a time", max_tokens: 5, temperature: 0 });
check(completion.object === "text_completion", "completion object");
check(typeof completion.choices[0].text === "string", "completion text");
check(completion.usage.completion_tokens === 5, "completion usage");

const cstream = await client.completions.create({
  model: "kimi-k3", prompt: "Once upon a time", max_tokens: 5, temperature: 0, stream: true,
});
let ctext = "";
for await (const chunk of cstream) ctext += chunk.choices.map((c) => c.text).join("");
check(ctext === completion.choices[0].text, "streamed completion equals the plain one");

try {
  await client.chat.completions.create({ model: "no-such-model", messages, max_tokens: 1 });
  check(false, "an unknown model is refused");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 404, `unknown model gives a 404 APIError (got ${e})`);
  check(e.code === "model_not_found", "error code");
}
console.log("openai client: all checks passed");
