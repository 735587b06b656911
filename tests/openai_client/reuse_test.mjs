// State reuse as the official OpenAI Node client sees it (issue 26): thinking on, the client sends
// back only each answer's `content` (never `reasoning_content`), so the server cannot continue
// the state the answer left; it must continue from the snapshot at the end of the previous
// request's messages. Started by tests/reuse_e2e_test.cpp with
//   DELTAFIN_BASE_URL  the server's /v1 URL
//   REUSE_PHASE        "turns": the conversations below; "restart": one more turn of the first
//                      conversation, against a server restarted over the same --state-cache
//   REUSE_FILE         where "turns" leaves the first conversation for "restart"
//   REUSE_CHECK        "0": only record the answers (a server with --state-cache none)
// Prints one line "answers: [...]" (every answer, in order, for the C++ test to compare with a
// server that reuses nothing) and exits non-zero with a message on the first failed check.
//
// What the client added since its previous request is counted with the server's /tokenize of
// the K3 rendering of those messages (docs/MODEL.md, the chat format); each count is checked
// against the growth of prompt_tokens, so a wrong rendering here fails the test rather than
// loosening it.
import OpenAI from "openai";
import fs from "node:fs";

const base = process.env.DELTAFIN_BASE_URL;
const phase = process.env.REUSE_PHASE || "turns";
const checking = process.env.REUSE_CHECK !== "0";
const client = new OpenAI({ baseURL: base, apiKey: "unused", maxRetries: 0, timeout: 120000 });

function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
}

async function tokens(text) {
  const r = await fetch(base.replace(/\/v1$/, "") + "/tokenize", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ content: text }),
  });
  check(r.status === 200, `/tokenize answers 200 (got ${r.status})`);
  return (await r.json()).tokens.length;
}

const O = "<|open|>", C = "<|close|>", S = "<|sep|>", E = "<|end_of_msg|>";
const userText = (text) => `${O}message role="user"${S}${text}${C}message${S}${E}`;
const systemText = (text) => `${O}message role="system"${S}${text}${C}message${S}${E}`;
// An assistant message sent back without its reasoning: an empty think block, then the answer.
const answerText = (text) =>
  `${O}message role="assistant"${S}${O}think${S}${C}think${S}${O}response${S}${text}${C}response${S}${C}message${S}${E}`;
const blockText = (type, text) => `${O}message role="system" type="${type}"${S}${text}${C}message${S}${E}`;
const GEN = await tokens(`${O}message role="assistant"${S}${O}think${S}`);  // the generation prompt
const RAW_JSON =
  "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
const RF_BLOCK = await tokens(blockText("response-format",
  "The system is invoked with `response_format=json_object`.\n" + RAW_JSON));
const TC_BLOCK = await tokens(blockText("tool-choice",
  "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message."));

const answers = [];
let last = null;  // the previous request's usage

// One request; `added` is the number of tokens the client added since the previous request
// (null: no bound to check) and `after` what follows the messages (the generation prompt and
// any tool-choice / response-format block).
async function ask(what, messages, added, extra = {}, after = GEN) {
  const r = await client.chat.completions.create({
    model: "kimi-k3", messages, max_tokens: 6, temperature: 0, thinking: true, ...extra,
  });
  const u = r.usage;
  const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
  const prefilled = u.prompt_tokens - cached;
  console.log(`${what}: prompt ${u.prompt_tokens}, cached ${cached}, prefilled ${prefilled}` +
    (added === null ? "" : `, added ${added} + ${after} after the messages`));
  if (checking && added !== null) {
    check(prefilled <= added + after,
      `${what}: prefilled ${prefilled} tokens, at most ${added} added + ${after} expected`);
  }
  const m = r.choices[0].message;
  answers.push({ content: m.content ?? "", reasoning: m.reasoning_content ?? "" });
  last = u;
  return m.content ?? "";
}

const longSystem = Array.from({ length: 56 }, (_, i) => `rule ${i}: be brief.`).join(" ");
const systemTokens = await tokens(systemText(longSystem));

if (phase === "turns") {
  check(systemTokens >= 1000, `the shared system prompt is >= 1000 tokens (${systemTokens})`);
  // A: a 5-turn conversation behind a 1,000-token system prompt.
  const a = [{ role: "system", content: longSystem }];
  let added = null;
  for (let turn = 1; turn <= 5; ++turn) {
    const text = `Turn ${turn}: tell me something about the number ${turn * 7}.`;
    a.push({ role: "user", content: text });
    added = turn === 1 ? null : added + (await tokens(userText(text)));
    const prev = last?.prompt_tokens;
    const content = await ask(`turn ${turn}`, a, added);
    // The counted additions are what the prompt grew by (the renderings above are the server's).
    check(turn === 1 || last.prompt_tokens - prev === added,
      `turn ${turn}: the prompt grew by ${last.prompt_tokens - prev}, counted ${added}`);
    a.push({ role: "assistant", content });  // only the content goes back
    added = await tokens(answerText(content));
  }
  fs.writeFileSync(process.env.REUSE_FILE, JSON.stringify(a));
  const turn5 = a.slice(0, -1);
  // Regenerate: the same request again prefills at most the generation prompt.
  await ask("regenerate turn 5", turn5, 0);
  check(answers.at(-1).content === answers.at(-2).content &&
    answers.at(-1).reasoning === answers.at(-2).reasoning, "a regenerated greedy answer is the same");
  // Edit the last user message: at most the edited message is prefilled (and the prompt).
  const edited = turn5.slice(0, -1).concat([{ role: "user", content: "Turn 5, edited: say more." }]);
  const editedTokens = await tokens(userText(edited.at(-1).content));
  const before = last.prompt_tokens;
  await ask("edited turn 5", edited, editedTokens);
  check(last.prompt_tokens - before === editedTokens - (await tokens(userText(turn5.at(-1).content))),
    "the edited prompt differs by the counted message");
  // A request with response_format, then one with tool_choice, continuing the conversation: the
  // block after the messages is new text too.
  const rf = a.concat([{ role: "user", content: "Answer as JSON." }]);
  await ask("turn 6 with response_format", rf, added + (await tokens(userText(rf.at(-1).content))),
    { response_format: { type: "json_object" } }, GEN + RF_BLOCK);
  const tc = rf.slice(0, -1).concat([{ role: "user", content: "No tools now." }]);
  await ask("turn 6 with tool_choice", tc, added + (await tokens(userText(tc.at(-1).content))),
    { tool_choice: "none" }, GEN + TC_BLOCK);
  // B: a second conversation with the same system prompt prefills only its own message.
  const b = [{ role: "system", content: longSystem }, { role: "user", content: "Another chat." }];
  await ask("conversation B", b, await tokens(userText(b[1].content)));
} else {
  // After a restart over the same --state-cache: the next turn continues from disk.
  const a = JSON.parse(fs.readFileSync(process.env.REUSE_FILE, "utf8"));
  const text = "Turn 6 after a restart.";
  a.push({ role: "user", content: text });
  await ask("turn 6 after a restart", a,
    (await tokens(answerText(a.at(-2).content))) + (await tokens(userText(text))));
}
console.log("answers: " + JSON.stringify(answers));
console.log("reuse: all checks passed");
