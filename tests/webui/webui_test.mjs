// The browser page of `deltafin serve` in a real browser: Debian's headless Chromium driven by
// puppeteer-core. Started by tests/webui_test.cpp with DELTAFIN_BINARY, DELTAFIN_MODEL (the tiny
// synthetic model), DELTAFIN_TMP (a per-test folder) and DELTAFIN_SCREENSHOTS (docs/) set. The
// script starts the servers itself because one scenario restarts the server on the same port.
// Exits non-zero with a message on the first failed check.
//
// Scenarios: the page asks for the API key and sends it (also on the engine stream); a message
// streams an answer with its stats; a reload finds the conversation; the engine view updates
// while a request runs and draws the last passes as a timeline; model output with <script> and <img onerror> renders as text (the
// answer is injected by intercepting the chat request, so it travels the page's real streaming
// and rendering path); and at 0.2 tokens/s (the server slowed by DELTAFIN_DEBUG_STEP_DELAY_MS)
// a stream is stopped midway, then the server restarts and the page reconnects. Images attached,
// pasted and dropped in the composer show as thumbnails and go out as image_url data-URL parts.
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import puppeteer from "puppeteer-core";

const BIN = process.env.DELTAFIN_BINARY;
const MODEL = process.env.DELTAFIN_MODEL;
const TMP = process.env.DELTAFIN_TMP;
const SHOTS = process.env.DELTAFIN_SCREENSHOTS;
const CHROMIUM = process.env.DELTAFIN_CHROMIUM || "/usr/bin/chromium";
const DATA = process.env.DELTAFIN_TEST_DATA; // tests/data
const KEY = "sk-webui-test";

function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `deltafin serve` and resolves with {proc, port} once it is ready.
function startServer(port, env = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(BIN, ["serve", "--model", MODEL, "--port", String(port), "--api-key", KEY], {
      env: { ...process.env, ...env },
      stdio: ["ignore", "ignore", "pipe"],
    });
    let err = "";
    let got = 0;
    const timer = setTimeout(() => reject(new Error("server did not start:\n" + err)), 60000);
    proc.stderr.on("data", (d) => {
      err += d;
      const m = err.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) got = Number(m[1]);
      if (got && err.includes("deltafin serve: ready")) {
        clearTimeout(timer);
        resolve({ proc, port: got, log: () => err });
      }
    });
    proc.on("exit", (code) => reject(new Error(`server exited with ${code}:\n${err}`)));
  });
}

function stopServer(s) {
  return new Promise((resolve) => {
    s.proc.removeAllListeners("exit");
    s.proc.on("exit", resolve);
    s.proc.kill("SIGTERM");
  });
}

async function waitFor(page, fn, what, timeout = 60000, ...args) {
  try {
    await page.waitForFunction(fn, { timeout, polling: 100 }, ...args);
  } catch (e) {
    throw new Error(`timed out waiting for ${what}: ${e.message}`);
  }
}

const text = (page, sel) => page.$eval(sel, (e) => e.textContent);

let server = await startServer(0);
const port = server.port;
const base = `http://127.0.0.1:${port}`;
const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  userDataDir: path.join(TMP, "chromium-profile"),
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const pageErrors = [];
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1200, height: 800 });
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  const notFound = []; // every request the page makes must exist (the favicon too)
  page.on("response", (r) => { if (r.status() === 404) notFound.push(r.url()); });
  page.on("console", (m) => {
    // A CSP violation would show up here: the page must not need any.
    if (m.type() === "error" && /Content.Security.Policy/i.test(m.text())) pageErrors.push(m.text());
  });

  // 1. The page loads from the binary with its policy.
  const res = await page.goto(base + "/", { waitUntil: "load" });
  check(res.status() === 200, "GET / is 200");
  check((res.headers()["content-security-policy"] || "").includes("script-src 'self'"), "CSP header");
  await waitFor(page, () => document.getElementById("server-status").textContent === "server ready", "health");
  // No key stored and none asked for yet: no API key button; nothing to regenerate yet.
  check(await page.$eval("#key-button", (e) => e.hidden), "no API key button before the server asks");
  check(await page.$eval("#regenerate", (e) => e.disabled), "Regenerate disabled on an empty conversation");

  // 2. Send a message: the server answers 401, the page asks for the key, then streams.
  await page.click("#settings summary");
  await page.$eval("#thinking", (e) => { e.checked = false; });
  await page.$eval("#max-tokens", (e) => { e.value = "12"; });
  await page.$eval("#temperature", (e) => { e.value = "0"; });
  await page.type("#prompt", "Hello from the browser test");
  await page.click("#send");
  await waitFor(page, () => document.getElementById("key-dialog").open, "the API key dialog");
  await page.type("#key-input", KEY);
  await page.click("#key-save");
  await waitFor(page, () => {
    const s = document.querySelector(".msg.assistant .stats");
    return s && s.textContent.includes("tok/s");
  }, "the streamed answer's stats");
  const stats = await text(page, ".msg.assistant .stats");
  check(/prompt \d+ tok/.test(stats) && /completion \d+ tok/.test(stats), `token counts in stats (${stats})`);
  check(/TTFT [\d.]+ s/.test(stats), `time to first token in stats (${stats})`);
  const answer = await text(page, ".msg.assistant .content");
  check(answer.length > 0, "the answer has text");
  check(await page.evaluate(() => localStorage.getItem("deltafin.apiKey")) === KEY, "key kept");
  check(!(await page.$eval("#key-button", (e) => e.hidden)), "the API key button once the server asked");

  // 3. Reload: the conversation is still there.
  await page.reload({ waitUntil: "load" });
  await waitFor(page, () => document.querySelectorAll(".msg").length === 2, "the kept conversation");
  check((await text(page, "#conversations li")).includes("Hello from the browser test"), "conversation title");
  check((await text(page, ".msg.user .content")).includes("Hello from the browser test"), "user message");
  check((await text(page, ".msg.assistant .content")) === answer, "the answer survives a reload");
  if (SHOTS) await page.screenshot({ path: path.join(SHOTS, "webui-chat.png") });

  // Regenerate replaces the last answer; edit puts a message back in the composer and drops it
  // and what followed; export gives the JSON `deltafin chat`'s /save writes.
  await page.click("#regenerate");
  await waitFor(page, () => {
    const m = document.querySelectorAll(".msg");
    const s = document.querySelector(".msg.assistant .stats");
    return m.length === 2 && s && s.textContent.includes("tok/s") && document.getElementById("stop").disabled;
  }, "the regenerated answer");
  const exported = await page.evaluate(async () => {
    let blob = null;
    const orig = URL.createObjectURL;
    URL.createObjectURL = (b) => { blob = b; return orig.call(URL, b); };
    document.getElementById("export-chat").click();
    URL.createObjectURL = orig;
    return JSON.parse(await blob.text());
  });
  check(exported.messages.length === 2 && exported.messages[0].role === "user" &&
    exported.messages[0].content === "Hello from the browser test" && exported.thinking === false &&
    typeof exported.reasoning_effort === "string", `export has chat's /save shape (${JSON.stringify(exported)})`);
  await page.click(".msg.user .edit");
  check((await page.$eval("#prompt", (e) => e.value)) === "Hello from the browser test", "edit fills the composer");
  check((await page.$$(".msg")).length === 0, "edit drops the message and its answer");
  await page.click("#send");
  await waitFor(page, () => {
    const s = document.querySelector(".msg.assistant .stats");
    return s && s.textContent.includes("tok/s") && document.getElementById("stop").disabled;
  }, "the resent answer");

  // 4. The engine view updates while a request runs.
  await page.goto(base + "/#engine", { waitUntil: "load" });
  await waitFor(page, () => Number(document.body.dataset.engineSnapshots || 0) >= 2, "engine snapshots");
  const before = await page.evaluate(() => Number(document.body.dataset.engineSnapshots));
  // A longer request in the background; the view must show it running.
  const side = page.evaluate(async (key) => {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: "Bearer " + key },
      // ~1500 prompt tokens: a few seconds of prefill on the tiny model, whatever it samples.
      body: JSON.stringify({ messages: [{ role: "user", content: "Engine view. ".repeat(120) }],
        max_tokens: 200, thinking: false }),
    });
    return (await r.json()).usage.completion_tokens;
  }, KEY);
  await waitFor(page, () => document.getElementById("e-active").textContent === "1 / 1", "an active sequence shown");
  await waitFor(page, (n) => Number(document.body.dataset.engineSnapshots) >= n + 3, "more snapshots", 30000, before);
  await waitFor(page, () => Number(document.body.dataset.timelineSpans || 0) > 0, "the timeline of the last passes");
  // The side request's ~1500-token prefill can fill the last passes (under a sanitizer it takes
  // most of a minute): wait until a decoding pass, which samples, is among them.
  await waitFor(page, () => (document.body.dataset.timelineNames || "").split(",").includes("sample"),
    "a decoding pass in the timeline", 180000);
  if (SHOTS) {
    await page.setViewport({ width: 1200, height: 1150 });
    await page.screenshot({ path: path.join(SHOTS, "webui-engine.png") });
    await page.setViewport({ width: 1200, height: 800 });
  }
  check((await side) > 0, "the side request ran");
  await waitFor(page, () => /hits/.test(document.getElementById("heat-info").textContent), "heat map info");
  const heat = await text(page, "#heat-info");
  check(!/since start 0 hits, 0 misses/.test(heat), `heat map counts requests (${heat})`);
  check(/^experts 0–\d+ →$/.test(await text(page, "#heat-x")) &&
    /^layers 0–\d+ ↓$/.test(await text(page, "#heat-y")), "heat map axis labels");
  check((await page.$$("#memory-bar div")).length === 5, "memory bar segments");
  check((await text(page, "#e-disk")).includes("MB/s"), "disk bandwidth shown");
  check((await page.$$("#io-chart polyline")).length === 2, "I/O chart lines");
  // The last passes as a timeline: the scheduler's spans nested by row (every layer inside a
  // pass, on the row below it), the legend naming what is drawn, and a screenshot of it.
  const drawn = await page.evaluate(() => document.body.dataset.timelineNames.split(","));
  for (const n of ["pass", "layer", "attention", "router", "moe", "expert", "sample"])
    check(drawn.includes(n), `the timeline draws ${n} spans (${drawn})`);
  check(/^last [123] pass(es)?, [\d.]+ ms, \d+ spans on \d+ threads?/.test(await text(page, "#timeline-info")),
    "the timeline's summary");
  check(await page.evaluate(() => {
    const box = (r) => ({ x: +r.getAttribute("x"), w: +r.getAttribute("width"), y: +r.getAttribute("y") });
    const passes = [...document.querySelectorAll('#timeline rect[data-name="pass"]')].map(box);
    const layers = [...document.querySelectorAll('#timeline rect[data-name="layer"]')].map(box);
    return passes.length > 0 && layers.length > 0 && layers.every((l) =>
      passes.some((p) => l.x >= p.x - 0.01 && l.x + l.w <= p.x + Math.max(p.w, 0.5) + 0.51 && l.y > p.y));
  }), "every layer is drawn inside a pass");
  check((await page.$$("#timeline-legend .sw")).length === drawn.filter((n) => n).length, "a legend entry per span name");
  if (SHOTS) {
    await page.setViewport({ width: 1200, height: 1600 });
    await (await page.$("#timeline-box")).screenshot({ path: path.join(SHOTS, "webui-timeline.png") });
    await page.setViewport({ width: 1200, height: 800 });
    check(fs.statSync(path.join(SHOTS, "webui-timeline.png")).size > 1000, "the timeline screenshot was written");
  }

  // 5. Untrusted output renders as text.
  await page.goto(base + "/#chat", { waitUntil: "load" });
  const evil = "Look: <script>window.__pwned = 1</script> and <img src=x onerror=\"window.__pwned = 2\"> " +
    "`<b>code</b>`\n\n```html\n<img src=y onerror=\"window.__pwned = 3\">\n```";
  await page.setRequestInterception(true);
  const interceptor = (req) => {
    if (req.method() === "POST" && req.url().endsWith("/v1/chat/completions")) {
      const chunk = (delta, extra = {}) =>
        "data: " + JSON.stringify({ object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: null }], ...extra }) + "\n\n";
      req.respond({
        status: 200,
        contentType: "text/event-stream",
        body: chunk({ role: "assistant", content: "" }) + chunk({ content: evil.slice(0, 30) }) +
          chunk({ content: evil.slice(30) }) +
          chunk({ tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "get_weather", arguments: "" } }] }) +
          chunk({ tool_calls: [{ index: 0, function: { arguments: "{\"city\":\"<b>Paris</b>\"}" } }] }) +
          "data: " + JSON.stringify({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 9 },
            timings: { prompt_n: 3, prompt_ms: 1, predicted_n: 9, predicted_ms: 9, predicted_per_second: 888, ttft_ms: 2,
              draft_n: 10, draft_n_accepted: 7, target_passes: 4, tokens_per_pass: 2.25 } }) + "\n\n" + "data: [DONE]\n\n",
      });
    } else {
      req.continue();
    }
  };
  page.on("request", interceptor);
  await page.click("#new-chat");
  await page.type("#prompt", "Say something dangerous");
  await page.click("#send");
  await waitFor(page, () => {
    const s = document.querySelector(".msg.assistant .stats");
    return s && s.textContent.includes("888");
  }, "the injected answer");
  page.off("request", interceptor);
  await page.setRequestInterception(false);
  const injected = await page.evaluate(() => ({
    pwned: window.__pwned,
    imgs: document.querySelectorAll("#messages img").length,
    scripts: document.querySelectorAll("#messages script").length,
    bolds: document.querySelectorAll("#messages b").length,
    text: document.querySelector(".msg.assistant .content").textContent,
    pre: document.querySelector(".msg.assistant pre") !== null,
    stats: document.querySelector(".msg.assistant .stats").textContent,
    tool: (document.querySelector(".msg.assistant .tool-call") || {}).textContent,
  }));
  check(injected.pwned === undefined, "no injected code ran");
  check(injected.imgs === 0 && injected.scripts === 0 && injected.bolds === 0, "no injected elements");
  check(injected.text.includes("<script>window.__pwned = 1</script>"), "the script tag shows as text");
  check(injected.text.includes('<img src=x onerror="window.__pwned = 2">'), "the img tag shows as text");
  check(injected.pre, "the fenced code renders as a code block");
  check(injected.tool === 'tool call: get_weather({"city":"<b>Paris</b>"})', `the tool call is shown (${injected.tool})`);
  check(injected.stats.includes("drafts 7/10 accepted (70%)") && injected.stats.includes("2.25 tok/pass"),
    `draft stats shown when present (${injected.stats})`);

  // 5b. Images: attached with the file picker, pasted and dropped into the composer, shown as
  // thumbnails there and in the transcript, and sent as image_url parts holding data URLs. The
  // answer is injected (the page is under test here; the server's image path has its own tests).
  const png = fs.readFileSync(path.join(DATA, "vision", "tiny_20x9.png"));
  const pngUrl = "data:image/png;base64," + png.toString("base64");
  await page.click("#new-chat");
  const picker = await page.$("#attach-input");
  await picker.uploadFile(path.join(DATA, "vision", "tiny_20x9.png"));
  await waitFor(page, () => document.querySelectorAll("#attachments .thumb img").length === 1, "the attached thumbnail");
  await page.evaluate((url) => {
    // From base64 by hand: the page's policy (connect-src 'self') refuses fetch() of a data: URL.
    const bin = atob(url.slice(url.indexOf(",") + 1));
    const blob = new Blob([Uint8Array.from(bin, (ch) => ch.charCodeAt(0))], { type: "image/png" });
    const file = (name) => new File([blob], name, { type: "image/png" });
    const pasted = new DataTransfer();
    pasted.items.add(file("pasted.png"));
    document.getElementById("prompt").dispatchEvent(new ClipboardEvent("paste", { clipboardData: pasted, bubbles: true, cancelable: true }));
    const dropped = new DataTransfer();
    dropped.items.add(file("dropped.png"));
    dropped.items.add(new File(["<svg/>"], "vector.svg", { type: "image/svg+xml" }));
    document.getElementById("composer").dispatchEvent(new DragEvent("drop", { dataTransfer: dropped, bubbles: true, cancelable: true }));
  }, pngUrl);
  await waitFor(page, () => document.querySelectorAll("#attachments .thumb img").length === 3, "pasted and dropped thumbnails");
  check((await text(page, "#attachments .attach-error")).includes("vector.svg"), "an SVG is refused in the composer");
  let sentBody = null;
  await page.setRequestInterception(true);
  const imageInterceptor = (req) => {
    if (req.method() === "POST" && req.url().endsWith("/v1/chat/completions")) {
      sentBody = JSON.parse(req.postData());
      req.respond({
        status: 200,
        contentType: "text/event-stream",
        body: "data: " + JSON.stringify({ choices: [{ index: 0, delta: { role: "assistant", content: "A small picture." }, finish_reason: null }] }) +
          "\n\ndata: [DONE]\n\n",
      });
    } else {
      req.continue();
    }
  };
  page.on("request", imageInterceptor);
  await page.type("#prompt", "What is in these?");
  await page.click("#send");
  await waitFor(page, () => {
    const c = document.querySelector(".msg.assistant .content");
    return c && c.textContent.includes("A small picture.") && document.getElementById("stop").disabled;
  }, "the answer to the images");
  page.off("request", imageInterceptor);
  await page.setRequestInterception(false);
  const sentUser = sentBody.messages.filter((m) => m.role === "user").pop();
  check(Array.isArray(sentUser.content) && sentUser.content.length === 4 &&
    sentUser.content[0].type === "text" && sentUser.content[0].text === "What is in these?" &&
    sentUser.content.slice(1).every((p) => p.type === "image_url" && p.image_url.url === pngUrl),
  `the images sent as image_url data-URL parts (${JSON.stringify(sentUser).slice(0, 300)})`);
  check((await page.$$("#attachments .thumb")).length === 0, "the composer is cleared after sending");
  check((await page.$$(".msg.user .images img")).length === 3, "thumbnails in the transcript");
  await page.reload({ waitUntil: "load" });
  await waitFor(page, () => document.querySelectorAll(".msg.user .images img").length === 3, "the images kept over a reload");

  // 6. 0.2 tokens/s: restart the server slowed down; the page notices and reconnects.
  await page.goto(base + "/#engine", { waitUntil: "load" });
  await waitFor(page, () => document.getElementById("engine-status").textContent.startsWith("live"), "engine live");
  await stopServer(server);
  await waitFor(page, () => document.getElementById("engine-status").textContent.startsWith("disconnected"),
    "the engine view noticing the restart");
  await waitFor(page, () => document.getElementById("server-status").textContent.includes("unreachable"),
    "the status noticing the restart", 15000);
  server = await startServer(port, { DELTAFIN_DEBUG_STEP_DELAY_MS: "5000" });
  await waitFor(page, () => document.getElementById("engine-status").textContent.startsWith("live"),
    "the engine view reconnecting", 30000);
  await page.goto(base + "/#chat", { waitUntil: "load" });
  await page.click("#new-chat");
  await page.click("#settings summary");
  await page.$eval("#thinking", (e) => { e.checked = false; });
  await page.$eval("#max-tokens", (e) => { e.value = "200"; });
  await page.type("#prompt", "A long answer, slowly");
  await page.click("#send");
  // The prefill pass and the first token take one slowed step; wait for two tokens of text.
  await waitFor(page, () => {
    const c = document.querySelector(".msg.assistant .content");
    return c && c.textContent.length >= 2;
  }, "the slow stream's first tokens", 40000);
  check(await page.$eval("#stop", (e) => !e.disabled), "Stop is enabled while streaming");
  await page.click("#stop");
  await waitFor(page, () => {
    const s = document.querySelector(".msg.assistant .stats");
    return s && s.textContent.includes("stopped");
  }, "the stopped answer", 10000);
  check(await page.$eval("#send", (e) => !e.disabled), "Send is enabled after a stop");
  const partial = await text(page, ".msg.assistant .content");
  await page.reload({ waitUntil: "load" });
  await waitFor(page, () => document.querySelectorAll(".msg").length >= 2, "the stopped conversation kept");
  check((await text(page, ".msg.assistant .content")) === partial, "the partial answer is kept");
  check(pageErrors.length === 0, "no page errors: " + pageErrors.join("; "));
  check(notFound.length === 0, "no request answered 404 (favicon included): " + notFound.join(", "));
  console.log("webui browser test passed");
} finally {
  await browser.close();
  await stopServer(server);
}
