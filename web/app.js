// Deltafin's browser page: the chat (conversations in localStorage, streamed answers over
// fetch(), since EventSource cannot send the API key) and the engine view (a fetch()-read SSE
// stream of engine snapshots). Written without a framework or build step so the server can embed
// it as is. Model output is untrusted: it only ever reaches the page as text nodes (textContent),
// never as markup; the Markdown renderer builds elements itself. Images (attached, pasted or
// dropped in the composer) go out as OpenAI image_url parts holding data URLs: the one form every
// API of the server turns an image into, so the page needs no other.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE_KEY = "deltafin.conversations";
const KEY_KEY = "deltafin.apiKey";
const SETTINGS_KEY = "deltafin.settings";
const SETTINGS = ["thinking", "effort", "temperature", "max-tokens"];
// Images the composer accepts: what the server takes (docs/SERVER.md, "Images"); the server checks
// again and is the one that decides.
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
const IMAGE_MAX_BYTES = 20 * 1024 * 1024;

// ---------- API access ----------

function apiKey() {
  return localStorage.getItem(KEY_KEY) || "";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h.Authorization = "Bearer " + apiKey();
  return h;
}

let keyWaiters = [];
function askForKey(reason) {
  $("key-reason").textContent = reason;
  $("key-input").value = apiKey();
  if (!$("key-dialog").open) {
    $("key-dialog").returnValue = "";
    $("key-dialog").showModal();
  }
  return new Promise((resolve) => keyWaiters.push(resolve));
}

function keyDialogClosed(saved) {
  if (saved) localStorage.setItem(KEY_KEY, $("key-input").value.trim());
  const w = keyWaiters;
  keyWaiters = [];
  w.forEach((r) => r(saved));
}

// fetch() with the key; a 401 asks for the key once and retries.
async function apiFetch(path, init = {}) {
  for (let attempt = 0; ; attempt++) {
    const res = await fetch(path, { ...init, headers: headers() });
    if (res.status !== 401 || attempt > 0) return res;
    $("key-button").hidden = false; // this server wants a key: offer to change it from now on
    const body = await res.json().catch(() => ({}));
    const msg = (body.error && body.error.message) || "API key required";
    if (!(await askForKey(msg + " — enter the key the server was started with."))) return res;
  }
}

async function errorText(res) {
  const body = await res.text();
  try {
    const j = JSON.parse(body);
    if (j.error && j.error.message) return `${res.status}: ${j.error.message}`;
  } catch (_) {
    /* not JSON */
  }
  return `${res.status}: ${body.slice(0, 300)}`;
}

// Reads a text/event-stream body; calls onData with each `data:` payload.
async function readSse(res, onData) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = frame
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) onData(data);
    }
  }
}

// ---------- Markdown, safely ----------

// Inline Markdown: `code`, **bold**, *italic*, [text](http…). Appends nodes to `parent`.
function renderInline(parent, text) {
  const re = /`([^`]+)`|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    let el;
    if (m[1] !== undefined) {
      el = document.createElement("code");
      el.textContent = m[1];
    } else if (m[2] !== undefined) {
      el = document.createElement("strong");
      el.textContent = m[2];
    } else if (m[3] !== undefined) {
      el = document.createElement("em");
      el.textContent = m[3];
    } else {
      el = document.createElement("a");
      el.textContent = m[4];
      el.href = m[5];
      el.rel = "noopener noreferrer";
      el.target = "_blank";
    }
    parent.appendChild(el);
    last = re.lastIndex;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

// Block Markdown: fenced code, headings, lists, paragraphs. Returns a fragment of elements
// whose every text is a text node.
function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  const lines = text.split("\n");
  let para = [];
  let list = null;
  const flushPara = () => {
    if (para.length) {
      const p = document.createElement("p");
      renderInline(p, para.join("\n"));
      frag.appendChild(p);
      para = [];
    }
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^```\s*([\w+-]*)/);
    if (fence) {
      flushPara();
      list = null;
      const code = [];
      i++;
      while (i < lines.length && !lines[i].startsWith("```")) code.push(lines[i++]);
      const pre = document.createElement("pre");
      const c = document.createElement("code");
      if (fence[1]) c.dataset.lang = fence[1];
      c.textContent = code.join("\n");
      pre.appendChild(c);
      frag.appendChild(pre);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)/);
    const bullet = line.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)/);
    if (heading) {
      flushPara();
      list = null;
      const h = document.createElement("h" + Math.min(6, heading[1].length + 2));
      renderInline(h, heading[2]);
      frag.appendChild(h);
    } else if (bullet) {
      flushPara();
      const kind = bullet[1] ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== kind) {
        list = document.createElement(kind);
        frag.appendChild(list);
      }
      const li = document.createElement("li");
      renderInline(li, bullet[2]);
      list.appendChild(li);
    } else if (line.trim() === "") {
      flushPara();
      list = null;
    } else {
      list = null;
      para.push(line);
    }
  }
  flushPara();
  return frag;
}

// ---------- Conversations ----------

let conversations = [];
let current = null; // the shown conversation
let running = null; // {controller, conv, msg} while a request streams

function load() {
  try {
    conversations = JSON.parse(localStorage.getItem(STORE_KEY) || "[]");
  } catch (_) {
    conversations = [];
  }
  if (!Array.isArray(conversations)) conversations = [];
}

// Conversations with images can outgrow the browser's storage (a few MB): then they are stored
// without their images (kept in this page until it is closed) rather than not at all.
function save() {
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(conversations));
  } catch (_) {
    const light = conversations.map((c) => ({
      ...c,
      messages: c.messages.map((m) => (m.images ? { ...m, images: [], imagesDropped: m.images.length } : m)),
    }));
    try {
      localStorage.setItem(STORE_KEY, JSON.stringify(light));
    } catch (_) {
      // nothing more to drop: the conversations live until the page closes
    }
  }
}

function newConversation() {
  const c = {
    id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6),
    title: "New conversation",
    system: $("system-prompt").value,
    messages: [],
  };
  conversations.unshift(c);
  return c;
}

function select(c) {
  current = c;
  $("system-prompt").value = c ? c.system || "" : "";
  renderList();
  renderMessages();
}

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of conversations) {
    const li = document.createElement("li");
    li.textContent = c.title;
    li.title = c.title;
    if (c === current) li.className = "current";
    li.addEventListener("click", () => select(c));
    ul.appendChild(li);
  }
}

function fmtStats(m) {
  const t = m.timings;
  const u = m.usage;
  if (!t && !u) return "";
  const parts = [];
  if (u) parts.push(`prompt ${u.prompt_tokens} tok`, `completion ${u.completion_tokens} tok`);
  if (t) {
    parts.push(`TTFT ${(t.ttft_ms / 1000).toFixed(2)} s`);
    parts.push(`${t.predicted_per_second.toFixed(2)} tok/s`);
    if (t.tokens_per_pass !== undefined) parts.push(`${t.tokens_per_pass.toFixed(2)} tok/pass`);
    if (t.draft_n !== undefined && t.draft_n > 0) {
      const pct = (100 * t.draft_n_accepted) / t.draft_n;
      parts.push(`drafts ${t.draft_n_accepted}/${t.draft_n} accepted (${pct.toFixed(0)}%)`);
    }
  }
  return parts.join(" · ");
}

function messageElement(m, index) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  div.dataset.index = index;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role === "user" ? "You" : "Kimi K3";
  if (m.role === "user" && !running) {
    const edit = document.createElement("button");
    edit.type = "button";
    edit.textContent = "edit";
    edit.className = "edit";
    edit.addEventListener("click", () => editMessage(index));
    role.appendChild(edit);
  }
  div.appendChild(role);
  if (m.reasoning_content) {
    const d = document.createElement("details");
    d.className = "thinking";
    const s = document.createElement("summary");
    s.textContent = "Thinking";
    d.appendChild(s);
    const body = document.createElement("div");
    body.textContent = m.reasoning_content;
    d.appendChild(body);
    if (m.streaming && !m.content) d.open = true;
    div.appendChild(d);
  }
  if ((m.images && m.images.length) || m.imagesDropped) {
    const box = document.createElement("div");
    box.className = "images";
    for (const url of m.images || []) {
      const img = document.createElement("img");
      img.src = url; // a data: URL the user attached (never model output)
      img.alt = "attached image";
      box.appendChild(img);
    }
    if (m.imagesDropped) {
      const note = document.createElement("span");
      note.className = "hint";
      note.textContent = `${m.imagesDropped} image(s) not kept (browser storage full)`;
      box.appendChild(note);
    }
    div.appendChild(box);
  }
  const body = document.createElement("div");
  body.className = "content";
  body.appendChild(renderMarkdown(m.content || ""));
  div.appendChild(body);
  for (const call of m.tool_calls || []) {
    const tc = document.createElement("div");
    tc.className = "tool-call";
    tc.textContent = `tool call: ${call.function.name}(${call.function.arguments})`;
    div.appendChild(tc);
  }
  if (m.error) {
    const e = document.createElement("div");
    e.className = "error";
    e.textContent = m.error;
    div.appendChild(e);
  }
  const st = fmtStats(m) + (m.stopped ? " · stopped" : "");
  if (st) {
    const s = document.createElement("div");
    s.className = "stats";
    s.textContent = st;
    div.appendChild(s);
  }
  return div;
}

function renderMessages() {
  const box = $("messages");
  const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.replaceChildren();
  if (current) current.messages.forEach((m, i) => box.appendChild(messageElement(m, i)));
  if (atEnd) box.scrollTop = box.scrollHeight;
  updateRegenerate();
}

// Regenerate needs a user message to answer again.
function updateRegenerate() {
  $("regenerate").disabled = !!running || !current || !current.messages.some((m) => m.role === "user");
}

function setRunning(r) {
  running = r;
  $("send").disabled = !!r;
  updateRegenerate();
  $("stop").disabled = !r;
}

// A message's content on the wire: its text, or with images the text part then one image_url
// part (a data URL) per image.
function wireContent(m) {
  if (!m.images || !m.images.length) return m.content || "";
  const parts = [];
  if (m.content) parts.push({ type: "text", text: m.content });
  for (const url of m.images) parts.push({ type: "image_url", image_url: { url } });
  return parts;
}

// The request body for the current conversation (the same messages `chat /save` writes).
function requestBody(c) {
  const messages = [];
  if (c.system) messages.push({ role: "system", content: c.system });
  for (const m of c.messages) {
    const out = { role: m.role, content: wireContent(m) };
    if (m.role === "assistant" && m.tool_calls && m.tool_calls.length) out.tool_calls = m.tool_calls;
    messages.push(out);
  }
  const body = {
    model: "kimi-k3",
    messages,
    stream: true,
    stream_options: { include_usage: true },
    thinking: $("thinking").checked,
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  if ($("effort").value) body.reasoning_effort = $("effort").value;
  return body;
}

async function generate(c) {
  saveSettings();
  const msg = { role: "assistant", content: "", streaming: true };
  c.messages.push(msg);
  const controller = new AbortController();
  setRunning({ controller, conv: c, msg });
  renderMessages();
  let calls = [];
  try {
    const res = await apiFetch("/v1/chat/completions", {
      method: "POST",
      body: JSON.stringify(requestBody(c)),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    await readSse(res, (data) => {
      if (data === "[DONE]") return;
      const j = JSON.parse(data);
      if (j.error) {
        msg.error = j.error.message;
        return;
      }
      if (j.usage) msg.usage = j.usage;
      if (j.timings) msg.timings = j.timings;
      for (const ch of j.choices || []) {
        const d = ch.delta || {};
        if (d.content) msg.content += d.content;
        if (d.reasoning_content) msg.reasoning_content = (msg.reasoning_content || "") + d.reasoning_content;
        for (const tc of d.tool_calls || []) {
          if (!calls[tc.index]) calls[tc.index] = { id: tc.id, type: "function", function: { name: "", arguments: "" } };
          const f = tc.function || {};
          if (f.name) calls[tc.index].function.name += f.name;
          if (f.arguments) calls[tc.index].function.arguments += f.arguments;
        }
        if (calls.length) msg.tool_calls = calls.filter(Boolean);
      }
      if (current === c) renderMessages();
    });
  } catch (e) {
    if (controller.signal.aborted) msg.stopped = true;
    else msg.error = "request failed: " + (e.message || e) + " (Regenerate retries)";
  }
  delete msg.streaming;
  setRunning(null);
  save();
  if (current === c) renderMessages();
}

function send(text, images = []) {
  if (running || (!text.trim() && !images.length)) return;
  if (!current) select(newConversation());
  const c = current;
  c.system = $("system-prompt").value;
  if (c.messages.length === 0) c.title = text.trim().slice(0, 60) || "Image";
  const m = { role: "user", content: text };
  if (images.length) m.images = images;
  c.messages.push(m);
  save();
  renderList();
  generate(c);
}

function regenerate() {
  if (running || !current || current.messages.length === 0) return;
  const msgs = current.messages;
  if (msgs[msgs.length - 1].role === "assistant") msgs.pop();
  if (msgs.length === 0 || msgs[msgs.length - 1].role !== "user") return;
  generate(current);
}

function editMessage(index) {
  if (running || !current) return;
  $("prompt").value = current.messages[index].content;
  pending = (current.messages[index].images || []).slice();
  renderAttachments();
  current.messages.splice(index);
  save();
  renderMessages();
  $("prompt").focus();
}

// The same JSON `deltafin chat`'s /save writes (and /load reads).
function exportCurrent() {
  if (!current) return;
  const messages = [];
  if (current.system) messages.push({ role: "system", content: current.system });
  for (const m of current.messages) {
    const o = { role: m.role, content: wireContent(m) };
    if (m.reasoning_content) o.reasoning_content = m.reasoning_content;
    messages.push(o);
  }
  const j = { messages, thinking: $("thinking").checked, reasoning_effort: $("effort").value || "high" };
  const blob = new Blob([JSON.stringify(j, null, 2) + "\n"], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = (current.title.replace(/[^\w-]+/g, "_").slice(0, 40) || "conversation") + ".json";
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ---------- Images in the composer: attach, paste, drop ----------

let pending = []; // data URLs to send with the next message

function renderAttachments(error) {
  const box = $("attachments");
  box.replaceChildren();
  pending.forEach((url, i) => {
    const t = document.createElement("div");
    t.className = "thumb";
    const img = document.createElement("img");
    img.src = url;
    img.alt = "image to send";
    const rm = document.createElement("button");
    rm.type = "button";
    rm.textContent = "×";
    rm.title = "Remove";
    rm.addEventListener("click", () => {
      pending.splice(i, 1);
      renderAttachments();
    });
    t.append(img, rm);
    box.appendChild(t);
  });
  if (error) {
    const e = document.createElement("span");
    e.className = "attach-error";
    e.textContent = error;
    box.appendChild(e);
  }
}

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

async function addImageFiles(files) {
  let error = "";
  for (const f of files) {
    if (!IMAGE_TYPES.includes(f.type)) {
      error = `${f.name || "file"}: not a PNG, JPEG, WebP or GIF image`;
      continue;
    }
    if (f.size > IMAGE_MAX_BYTES) {
      error = `${f.name || "image"}: over ${IMAGE_MAX_BYTES / 1048576} MB`;
      continue;
    }
    try {
      pending.push(await readAsDataUrl(f));
    } catch (e) {
      error = `${f.name || "image"}: cannot be read (${e})`;
    }
  }
  renderAttachments(error);
}

function initAttachments() {
  $("attach").addEventListener("click", () => $("attach-input").click());
  $("attach-input").addEventListener("change", async () => {
    await addImageFiles([...$("attach-input").files]);
    $("attach-input").value = "";
  });
  $("prompt").addEventListener("paste", (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])].filter((f) => f.type.startsWith("image/"));
    if (!files.length) return;
    e.preventDefault();
    addImageFiles(files);
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (e) => {
    if (![...e.dataTransfer.types].includes("Files")) return;
    e.preventDefault();
    composer.classList.add("dropping");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dropping"));
  composer.addEventListener("drop", (e) => {
    composer.classList.remove("dropping");
    if (!e.dataTransfer.files.length) return;
    e.preventDefault();
    addImageFiles([...e.dataTransfer.files]);
  });
}

// ---------- Engine view ----------

const ioHistory = []; // recent derived samples for the I/O chart
let prevSnap = null;
let recentHeat = null; // decayed recent requests per (layer, expert): [hits, misses]
let lastHeat = null; // the last heat map received (frames carry it only when it changed)
let engineOn = false;

function human(bytes) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (bytes >= 1024 && i < u.length - 1) {
    bytes /= 1024;
    i++;
  }
  return `${bytes.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function drawMemory(mem) {
  const bar = $("memory-bar");
  const legend = $("memory-legend");
  bar.replaceChildren();
  legend.replaceChildren();
  if (!mem) {
    legend.textContent = "no memory plan (mmap mode: the page cache holds the weights)";
    return;
  }
  const parts = [
    ["trunk", "trunk resident", mem.trunk_resident],
    ["experts", "expert cache", mem.expert_cache],
    ["states", "states", mem.states],
    ["buffers", "buffers", mem.buffers],
    ["free", "free", mem.free],
  ];
  for (const [cls, name, bytes] of parts) {
    const seg = document.createElement("div");
    seg.className = "seg-" + cls;
    seg.style.width = `${(100 * bytes) / mem.budget}%`;
    seg.title = `${name}: ${human(bytes)}`;
    bar.appendChild(seg);
    const l = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = "sw seg-" + cls;
    l.append(sw, ` ${name} ${human(bytes)}`);
    legend.appendChild(l);
  }
  legend.append(` of ${human(mem.budget)} budget`);
}

function drawChart(disk) {
  const svg = $("io-chart");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const W = 600, H = 160, N = 120;
  const maxRead = Math.max(disk || 0, ...ioHistory.map((h) => h.read), 1);
  const line = (vals, scale, color) => {
    const p = document.createElementNS(ns, "polyline");
    const pts = vals.map((v, i) => `${(W * (i + N - vals.length)) / (N - 1)},${H - (H * v) / scale}`);
    p.setAttribute("points", pts.join(" "));
    p.setAttribute("fill", "none");
    p.setAttribute("stroke", color);
    p.setAttribute("stroke-width", "2");
    svg.appendChild(p);
  };
  if (disk > 0) {
    const l = document.createElementNS(ns, "line");
    const y = H - (H * disk) / maxRead;
    l.setAttribute("x1", "0");
    l.setAttribute("x2", String(W));
    l.setAttribute("y1", String(y));
    l.setAttribute("y2", String(y));
    l.setAttribute("stroke", "#888");
    l.setAttribute("stroke-dasharray", "4 4");
    svg.appendChild(l);
  }
  line(ioHistory.map((h) => h.read), maxRead, "#2d5bd7");
  line(ioHistory.map((h) => h.wait), 1, "#e08a1e");
}

function drawHeat(heat) {
  const cv = $("heatmap");
  if (!heat || !heat.layers || !heat.experts || !heat.hits.length) {
    $("heat-info").textContent = "this expert provider does not count per-expert hits (mmap mode)";
    return;
  }
  const n = heat.layers * heat.experts;
  if (!recentHeat || recentHeat.length !== n * 2) recentHeat = new Float64Array(n * 2);
  const prev = lastHeat && lastHeat.hits.length === n ? lastHeat : null;
  let max = 0;
  for (let k = 0; k < n; k++) {
    const dh = prev ? heat.hits[k] - prev.hits[k] : heat.hits[k];
    const dm = prev ? heat.misses[k] - prev.misses[k] : heat.misses[k];
    recentHeat[2 * k] = recentHeat[2 * k] * 0.8 + dh;
    recentHeat[2 * k + 1] = recentHeat[2 * k + 1] * 0.8 + dm;
    max = Math.max(max, recentHeat[2 * k] + recentHeat[2 * k + 1]);
  }
  cv.width = heat.experts;
  cv.height = heat.layers;
  const ctx = cv.getContext("2d");
  const img = ctx.createImageData(heat.experts, heat.layers);
  for (let k = 0; k < n; k++) {
    const h = recentHeat[2 * k], m = recentHeat[2 * k + 1];
    const a = max > 0 ? (h + m) / max : 0;
    const miss = h + m > 0 ? m / (h + m) : 0; // green (all hits) to red (all misses)
    img.data[4 * k] = Math.round(42 + (214 - 42) * miss);
    img.data[4 * k + 1] = Math.round(157 + (69 - 157) * miss);
    img.data[4 * k + 2] = Math.round(85 + (69 - 85) * miss);
    img.data[4 * k + 3] = a > 0 ? Math.round(60 + 195 * a) : 0;
  }
  ctx.putImageData(img, 0, 0);
  let th = 0, tm = 0;
  for (let k = 0; k < n; k++) {
    th += heat.hits[k];
    tm += heat.misses[k];
  }
  $("heat-info").textContent = `${heat.layers} layers × ${heat.experts} experts; since start ${th} hits, ${tm} misses`;
  $("heat-x").textContent = `experts 0–${heat.experts - 1} →`;
  $("heat-y").textContent = `layers 0–${heat.layers - 1} ↓`;
}

// One row per drive experts are read from (serve --home): what each served and how fast.
function drawDrives(homes) {
  $("drives").hidden = !homes;
  if (!homes) return;
  const body = $("drives-table").querySelector("tbody");
  body.replaceChildren();
  for (const d of homes) {
    const tr = document.createElement("tr");
    const cells = [
      d.kind === "model" ? "model folder" : d.name,
      String(d.experts),
      String(d.reads),
      `${(d.bytes_read / 1e9).toFixed(3)} GB`,
      `${d.busy_s.toFixed(1)} s`,
      d.gb_per_s.toFixed(2),
      d.probe_bytes_per_s ? (d.probe_bytes_per_s / 1e9).toFixed(2) : "–",
      d.bad ? `not used: ${d.bad_reason}` : d.hedges ? `ok, ${d.hedges} hedged (${d.hedge_wins} won)` : "ok",
    ];
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.append(td);
    }
    if (d.bad) tr.className = "bad";
    body.append(tr);
  }
}

// The last passes as a timeline (the frames' `timeline`, docs/SERVER.md): one lane per thread,
// one row per nesting depth, x the time across the window. Spans nest per thread (they are
// scopes), so a span's row is the number of open spans it starts inside.
const timelineColors = {
  round: "#c9c9d2", prefill: "#b5b5c0", decode: "#b5b5c0", verify: "#b5b5c0", pass: "#9d9daa",
  embed: "#7a8a9a", layer: "#c7d3e8", attention: "#2d5bd7", "dense mlp": "#2a9d55", moe: "#2a9d55",
  router: "#8a4fd0", "routed experts": "#66b98a", expert: "#1f7a45", "shared experts": "#4bb3a3",
  "lm head": "#7a8a9a", sample: "#d0a21e", propose: "#d05fa2", "read wait": "#d64545",
  "trunk wait": "#e06a2a", read: "#2d5bd7", "trunk read": "#e08a1e",
};
function drawTimeline(t) {
  const svg = $("timeline");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const names = new Map(t.threads.map((th) => [th.tid, th.name]));
  // The engine's thread (main or scheduler) first, then the readers by number.
  const tids = [...names.keys()].sort((a, b) => {
    const ra = /^reader/.test(names.get(a)), rb = /^reader/.test(names.get(b));
    return ra !== rb ? (ra ? 1 : -1) : a - b;
  });
  const byTid = new Map(tids.map((tid) => [tid, []]));
  for (const sp of t.spans) if (byTid.has(sp[0])) byTid.get(sp[0]).push(sp);
  const W = 1000, G = 80, RH = 11, dur = Math.max(t.duration_us, 1);
  const x = (us) => G + ((W - G) * Math.min(Math.max(us, 0), dur)) / dur;
  // A time axis: about eight ticks at a round step (1, 2 or 5 × a power of ten, in ms).
  const raw = dur / 1000 / 8, pow = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * pow).find((v) => v >= raw);
  for (let ms = 0; ms * 1000 <= dur; ms += step) {
    const tx = x(ms * 1000);
    const tick = document.createElementNS(ns, "line");
    tick.setAttribute("x1", tx.toFixed(2));
    tick.setAttribute("x2", tx.toFixed(2));
    tick.setAttribute("y1", "11");
    tick.setAttribute("y2", "14");
    tick.setAttribute("stroke", "#888");
    svg.appendChild(tick);
    const lbl = document.createElementNS(ns, "text");
    lbl.setAttribute("x", tx.toFixed(2));
    lbl.setAttribute("y", "9");
    lbl.setAttribute("text-anchor", ms === 0 ? "start" : "middle");
    lbl.textContent = `${+ms.toFixed(6)} ms`;
    svg.appendChild(lbl);
  }
  let y = 16;
  const seen = new Set();
  for (const tid of tids) {
    const list = byTid.get(tid).sort((a, b) => a[2] - b[2] || b[3] - a[3]);
    const open = [];
    let depth = 0;
    const rows = [];
    for (const sp of list) {
      while (open.length && sp[2] >= open[open.length - 1]) open.pop();
      rows.push(open.length);
      depth = Math.max(depth, open.length + 1);
      open.push(sp[2] + sp[3]);
    }
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", "2");
    label.setAttribute("y", String(y + 9));
    label.textContent = names.get(tid);
    svg.appendChild(label);
    list.forEach((sp, i) => {
      const r = document.createElementNS(ns, "rect");
      const x0 = x(sp[2]);
      r.setAttribute("x", x0.toFixed(2));
      r.setAttribute("y", String(y + rows[i] * RH));
      r.setAttribute("width", Math.max(0.5, x(sp[2] + sp[3]) - x0).toFixed(2));
      r.setAttribute("height", String(RH - 1));
      r.setAttribute("fill", timelineColors[sp[1]] || "#999");
      r.dataset.name = sp[1];
      const title = document.createElementNS(ns, "title");
      const args = Object.entries(sp[4] || {}).map(([k, v]) => `${k} ${v}`).join(", ");
      title.textContent = `${sp[1]} ${(sp[3] / 1000).toFixed(3)} ms${args ? " (" + args + ")" : ""}`;
      r.appendChild(title);
      svg.appendChild(r);
      seen.add(sp[1]);
    });
    y += Math.max(1, depth) * RH + 4;
  }
  svg.setAttribute("viewBox", `0 0 ${W} ${y}`);
  svg.setAttribute("height", String(Math.min(600, y * 1.2)));
  const legend = $("timeline-legend");
  legend.replaceChildren();
  for (const n of Object.keys(timelineColors).filter((k) => seen.has(k))) {
    const l = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = "sw";
    sw.style.background = timelineColors[n];
    l.append(sw, ` ${n}`);
    legend.appendChild(l);
  }
  $("timeline-info").textContent =
    `last ${t.passes} pass${t.passes === 1 ? "" : "es"}, ${(t.duration_us / 1000).toFixed(1)} ms, ` +
    `${t.spans.length} spans on ${tids.length} thread${tids.length === 1 ? "" : "s"}` +
    (t.omitted ? ` (${t.omitted} shortest spans left out)` : "");
  document.body.dataset.timelineSpans = String(t.spans.length);
  document.body.dataset.timelineNames = [...seen].sort().join(",");
}

function onSnapshot(s) {
  $("engine-status").textContent = `live · ${new Date().toLocaleTimeString()} · ${s.model || ""}`;
  $("engine-status").className = "status";
  $("e-tps").textContent = s.tokens_per_second.toFixed(2);
  $("e-queue").textContent = `${s.queue} / ${s.queue_capacity}`;
  $("e-active").textContent = `${s.active} / ${s.parallel}`;
  const ex = s.experts;
  $("e-hit").textContent = ex.requests ? `${((100 * ex.hits) / ex.requests).toFixed(1)}%` : "–";
  const disk = s.disk_bandwidth_bytes_per_s || 0;
  $("e-disk").textContent = disk ? `${(disk / 1e6).toFixed(0)} MB/s` : "unknown";
  if (prevSnap) {
    const dt = Math.max(1e-3, s.time_s - prevSnap.time_s);
    const bytes = ex.bytes_read + s.trunk.bytes_streamed - prevSnap.experts.bytes_read - prevSnap.trunk.bytes_streamed;
    const wait = ex.io_wait_s + s.trunk.wait_s - prevSnap.experts.io_wait_s - prevSnap.trunk.wait_s;
    const tokens = s.generated_tokens - prevSnap.generated_tokens;
    ioHistory.push({ read: bytes / dt / 1e6, wait: Math.min(1, wait / dt), bytes, tokens, dt });
    if (ioHistory.length > 120) ioHistory.shift();
    const last = ioHistory[ioHistory.length - 1];
    $("e-read").textContent = `${last.read.toFixed(1)} MB/s`;
    $("e-wait").textContent = `${(100 * last.wait).toFixed(0)}%`;
    // Disk roofline over the last 10 s: the time the bytes read per token take at the disk's
    // bandwidth, against the time a token took.
    const win = ioHistory.slice(-20);
    const wb = win.reduce((a, h) => a + h.bytes, 0), wt = win.reduce((a, h) => a + h.tokens, 0);
    const wdt = win.reduce((a, h) => a + h.dt, 0);
    $("e-roof").textContent = disk && wt > 0 ? `${((100 * (wb / wt / disk)) / (wdt / wt)).toFixed(0)}%` : "–";
    drawChart(disk / 1e6);
  }
  if (s.draft_n !== undefined) {
    $("e-draft-card").hidden = false;
    $("e-draft").textContent = s.draft_n ? `${((100 * s.draft_n_accepted) / s.draft_n).toFixed(0)}%` : "–";
  }
  if (s.tokens_per_pass !== undefined) {
    $("e-tpp-card").hidden = false;
    $("e-tpp").textContent = s.tokens_per_pass.toFixed(2);
  }
  drawMemory(s.memory);
  drawDrives(s.homes);
  if (s.timeline) drawTimeline(s.timeline);
  if (s.heat) {
    drawHeat(s.heat);
    lastHeat = s.heat;
  }
  prevSnap = s;
  document.body.dataset.engineSnapshots = String(Number(document.body.dataset.engineSnapshots || 0) + 1);
}

// Keeps one engine stream open while the view is shown; reconnects (the server restarted, the
// network dropped) every 2 s until it is back.
let engineController = null;
async function engineLoop() {
  while (engineOn) {
    engineController = new AbortController();
    try {
      const res = await apiFetch("/v1/engine/events", { signal: engineController.signal });
      if (!res.ok) throw new Error(await errorText(res));
      await readSse(res, (d) => onSnapshot(JSON.parse(d)));
      throw new Error("the stream ended");
    } catch (e) {
      if (!engineOn) break;
      prevSnap = null;
      lastHeat = null; // a restarted server counts from zero
      $("engine-status").textContent = `disconnected (${e.message || e}); reconnecting…`;
      $("engine-status").className = "status bad";
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
}

// ---------- Wiring ----------

function showView() {
  const engine = location.hash === "#engine";
  $("chat-view").hidden = engine;
  $("engine-view").hidden = !engine;
  $("tab-chat").className = engine ? "" : "active";
  $("tab-engine").className = engine ? "active" : "";
  if (engine && !engineOn) {
    engineOn = true;
    engineLoop();
  } else if (!engine && engineOn) {
    engineOn = false;
    if (engineController) engineController.abort();
  }
}

async function pollHealth() {
  const el = $("server-status");
  try {
    const r = await fetch("/health");
    const j = await r.json();
    el.textContent = j.status === "ok" ? "server ready" : `server ${j.status}`;
    el.className = j.status === "ok" ? "status" : "status bad";
  } catch (_) {
    el.textContent = "server unreachable (retrying)";
    el.className = "status bad";
  }
}

// The generation settings survive a reload (the system prompt belongs to each conversation).
function loadSettings() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") || {};
  } catch (_) {
    saved = {};
  }
  for (const id of SETTINGS) {
    if (!(id in saved)) continue;
    if ($(id).type === "checkbox") $(id).checked = !!saved[id];
    else $(id).value = String(saved[id]);
  }
}

function saveSettings() {
  const out = {};
  for (const id of SETTINGS) out[id] = $(id).type === "checkbox" ? $(id).checked : $(id).value;
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(out));
}

function init() {
  load();
  loadSettings();
  for (const id of SETTINGS) $(id).addEventListener("change", saveSettings);
  select(conversations[0] || null);
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value;
    if (running || (!text.trim() && !pending.length)) return;
    $("prompt").value = "";
    const images = pending;
    pending = [];
    renderAttachments();
    send(text, images);
  });
  initAttachments();
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => running && running.controller.abort());
  $("regenerate").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", () => {
    if (!running) select(newConversation());
  });
  $("delete-chat").addEventListener("click", () => {
    if (running || !current) return;
    conversations = conversations.filter((c) => c !== current);
    save();
    select(conversations[0] || null);
  });
  $("export-chat").addEventListener("click", exportCurrent);
  $("system-prompt").addEventListener("change", () => {
    if (current) {
      current.system = $("system-prompt").value;
      save();
    }
  });
  $("key-button").hidden = !apiKey(); // shown once a key is stored or the server asks for one
  $("key-button").addEventListener("click", () => askForKey("The API key this server was started with (stored in this browser)."));
  // Save submits the form (returnValue "ok"); Cancel and Escape close it without saving.
  $("key-dialog").addEventListener("close", () => keyDialogClosed($("key-dialog").returnValue === "ok"));
  $("key-cancel").addEventListener("click", () => $("key-dialog").close("cancel"));
  window.addEventListener("hashchange", showView);
  showView();
  pollHealth();
  setInterval(pollHealth, 5000);
}

init();
