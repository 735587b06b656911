// The SDKs' own stream parsers on streams with tool calls: tests/api_clients_test.cpp writes what
// the server's Anthropic and Responses wires send for a K3 turn that thinks, answers and calls
// get_weather twice (the tiny random model never calls a tool), and this script serves those
// bytes to the official clients and checks what they make of them.
import http from "node:http";
import fs from "node:fs";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { check, failOnClientWarnings } from "./common.mjs";

failOnClientWarnings();
const anthropicStream = fs.readFileSync(process.env.DELTAFIN_ANTHROPIC_STREAM);
const responsesStream = fs.readFileSync(process.env.DELTAFIN_RESPONSES_STREAM);
const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(req.url.startsWith("/v1/messages") ? anthropicStream : responsesStream);
  });
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const base = `http://127.0.0.1:${server.address().port}`;

const anthropic = new Anthropic({ baseURL: base, apiKey: "x", maxRetries: 0 });
const ms = anthropic.messages.stream({ model: "kimi-k3", max_tokens: 100, messages: [{ role: "user", content: "Weather?" }] });
const inputs = [];
ms.on("inputJson", (_, snapshot) => inputs.push(snapshot));
const message = await ms.finalMessage();
const kinds = message.content.map((b) => b.type).join(",");
check(kinds === "thinking,text,tool_use,tool_use", `blocks ${kinds}`);
check(message.content[0].thinking === "Paris, then." && message.content[1].text === "Checking.", "thinking and text");
check(message.content[2].name === "get_weather" && message.content[2].input.city === "Paris", `first call ${JSON.stringify(message.content[2])}`);
check(message.content[3].input.city === "Rome" && message.content[2].id !== message.content[3].id, "second call");
check(message.stop_reason === "tool_use" && inputs.length > 0, "stop_reason tool_use, input streamed");

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: "x", maxRetries: 0 });
const rs = openai.responses.stream({ model: "kimi-k3", input: "Weather?" });
let args = "";
rs.on("response.function_call_arguments.delta", (e) => (args += e.delta));
const response = await rs.finalResponse();
const types = response.output.map((i) => i.type).join(",");
check(types === "reasoning,message,function_call,function_call", `items ${types}`);
check(response.output[1].content[0].text === "Checking.", "message text");
const call = response.output[2];
check(call.name === "get_weather" && JSON.parse(call.arguments).city === "Paris" && call.call_id.startsWith("call_"), `call ${JSON.stringify(call)}`);
check(args === call.arguments + response.output[3].arguments, "arguments streamed");
check(response.status === "completed", "completed");
server.close();
console.log("sdk stream parsers: all checks passed");
