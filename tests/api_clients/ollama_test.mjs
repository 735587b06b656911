// The `ollama` JavaScript library against `deltafin serve` (started by tests/api_clients_test.cpp):
// version, list, ps, show, chat streamed and not, generate, and the refusals of embed and of a
// truncated image.
import { Ollama } from "ollama";
import { base, check, failOnClientWarnings, key, truncatedPng } from "./common.mjs";

failOnClientWarnings();
const ollama = new Ollama({ host: base, headers: { Authorization: `Bearer ${key}` } });

check(typeof (await ollama.version()).version === "string", "version");
const list = await ollama.list();
check(list.models.some((m) => m.name === "kimi-k3"), `list names kimi-k3 (${JSON.stringify(list)})`);
check((await ollama.ps()).models[0].context_length > 0, "ps");
const show = await ollama.show({ model: "kimi-k3" });
check(show.model_info["kimi_k3.context_length"] > 0 && show.capabilities.includes("tools"), "show");

const ask = { model: "kimi-k3:latest", messages: [{ role: "user", content: "Say hello." }], think: false, options: { temperature: 0, num_predict: 6 } };
const whole = await ollama.chat({ ...ask, stream: false });
check(whole.done && whole.message.role === "assistant" && typeof whole.message.content === "string", "chat");
check(whole.eval_count === 6 && whole.done_reason === "length" && whole.prompt_eval_count > 0, `chat counts (${JSON.stringify(whole)})`);
let streamed = "", parts = 0, last = null;
for await (const part of await ollama.chat({ ...ask, stream: true })) {
  streamed += part.message.content;
  parts++;
  last = part;
}
check(parts >= 2 && last.done && last.eval_count === 6, "chat stream ends with done");
check(streamed === whole.message.content, `streamed chat equals the whole answer (${JSON.stringify(streamed)})`);

const thought = await ollama.chat({ ...ask, think: true, stream: false });
check(typeof thought.message.thinking === "string" && thought.message.thinking.length > 0, "think: true returns thinking");

const gen = await ollama.generate({ model: "kimi-k3", prompt: "Once upon a time", think: false, stream: false, options: { temperature: 0, num_predict: 4 } });
check(gen.done && typeof gen.response === "string" && gen.eval_count === 4, "generate");
let gtext = "";
for await (const part of await ollama.generate({ model: "kimi-k3", prompt: "Once upon a time", think: false, stream: true, options: { temperature: 0, num_predict: 4 } })) gtext += part.response;
check(gtext === gen.response, "streamed generate equals the whole answer");

try {
  await ollama.embed({ model: "kimi-k3", input: "hello" });
  check(false, "embed is refused");
} catch (e) {
  check(e.status_code === 400 && /does not support embeddings/.test(e.error), `embed refused clearly (got ${e})`);
}
try {
  await ollama.chat({ ...ask, model: "no-such-model", stream: false });
  check(false, "an unknown model is refused");
} catch (e) {
  check(e.status_code === 404 && /not found/.test(e.error), `unknown model: 404 (got ${e})`);
}
try {
  await ollama.chat({ ...ask, messages: [{ role: "user", content: "What is this?", images: [truncatedPng] }], stream: false });
  check(false, "a truncated image is refused");
} catch (e) {
  check(e.status_code === 400 && /^messages\[0\]\.images\[0\]: .*(truncated|this model is text only)/.test(e.error), `a truncated image: 400 naming it (got ${e})`);
}
console.log("ollama client: all checks passed");
