# The Python package against the CLI: the same ids as `deltafin run --json`, the same logits
# bytes as `deltafin logits`, streamed chunks that add up to the non-streamed response, the
# server's chat shapes, chat-state reuse, errors as exceptions, threads and Ctrl-C; images (paths
# and bytes) on the demo model, whose vision tower takes them by default.
import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import zlib

import numpy as np
import pytest

import deltafin
from conftest import OPTIONS


def run_json(binary, model_dir, *args):
    r = subprocess.run([binary, "run", "--json", "--model", model_dir, "--threads", "1", *args],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_version_and_help():
    assert deltafin.abi_version() == 1
    assert deltafin.__version__
    import pydoc
    doc = pydoc.render_doc(deltafin.Model)
    for word in ("memory_budget", "create_chat_completion", "logits", "tokenize", "chat",
                 "deltafin logits"):
        assert word in doc


def test_tokenize_round_trip(model, binary, model_dir):
    ids = model.tokenize("Hello, world")
    r = subprocess.run([binary, "tokenize", "--model", model_dir, "--text", "Hello, world"],
                       capture_output=True, text=True, check=True)
    assert ids == json.loads(r.stdout)
    assert model.detokenize(ids) == "Hello, world"
    # Special strings are text unless asked for.
    assert len(model.tokenize("<|end_of_msg|>", special=True)) == 1
    assert len(model.tokenize("<|end_of_msg|>")) > 1
    assert model.tokenize("") == []


def test_greedy_completion_matches_run_json(model, binary, model_dir):
    cli = run_json(binary, model_dir, "--prompt", "Once upon a time", "--max-new", "10")
    out = model.create_completion(prompt="Once upon a time", max_tokens=10, temperature=0)
    assert out["object"] == "text_completion"
    assert out["usage"]["completion_tokens"] == 10
    assert out["choices"][0]["text"] == cli["text"]
    assert model.last_stats["prompt_ids"] == cli["prompt_ids"]
    assert model.last_stats["completion_ids"] == cli["completion_ids"]
    # Streamed, and through the low-level session: the same ids.
    list(model.create_completion(prompt=cli["prompt_ids"], max_tokens=10, temperature=0,
                                 stream=True))
    assert model.last_stats["completion_ids"] == cli["completion_ids"]
    with model.session() as s:
        res = s.generate(cli["prompt_ids"], max_new_tokens=10)
    assert res["completion_ids"] == cli["completion_ids"]


def test_drafting_keeps_the_output_and_reports_its_stats(binary, model_dir):
    cli = run_json(binary, model_dir, "--prompt", "the cat and the cat and the cat and the",
                   "--max-new", "16")
    with deltafin.Model(model_dir, threads=1, draft="ngram", draft_max=4) as m:
        with m.session() as s:
            res = s.generate(cli["prompt_ids"], max_new_tokens=16)
        assert res["completion_ids"] == cli["completion_ids"]
        assert res["target_passes"] >= 1
        assert res["draft_accepted"] <= res["draft_proposed"]
        assert res["tokens_per_pass"] >= 1.0
        out = m.create_completion(prompt=cli["prompt_ids"], max_tokens=16, temperature=0)
        assert m.last_stats["completion_ids"] == cli["completion_ids"]
        # The response's timings carry the drafting figures, as the server's do.
        t = out["timings"]
        assert t["draft_n"] == m.last_stats["draft_proposed"]
        assert t["draft_n_accepted"] == m.last_stats["draft_accepted"]
        assert t["target_passes"] == m.last_stats["target_passes"] >= 1
    with pytest.raises(deltafin.ArgumentError, match="eagle"):
        deltafin.Model(model_dir, draft="eagle")
    with pytest.raises(deltafin.ArgumentError, match="draft_max"):
        deltafin.Model(model_dir, draft="ngram", draft_max=-1)
    with pytest.raises(deltafin.ArgumentError, match="draft_max.*at most 256"):  # issue 31 C7
        deltafin.Model(model_dir, draft="ngram", draft_max=10**9)


def test_homes_option(model, binary, model_dir, tmp_path):
    home = tmp_path / "home"
    subprocess.run([binary, "place", "--model", model_dir, "--home", str(home),
                    "--probe-size", "1M", "--quiet"], check=True, capture_output=True)
    ids = list(range(3, 20))
    options = dict(OPTIONS, memory_budget="48M", ctx=256, direct_io=False)
    with deltafin.Model(model_dir, **options) as plain:
        want = plain.logits(ids)
    with deltafin.Model(model_dir, homes=[home], **options) as m:
        assert np.array_equal(m.logits(ids), want)
        drives = m.stats["homes"]
        assert [d["kind"] for d in drives] == ["model", "home"]
        assert drives[1]["name"] == str(home)
    with pytest.raises(TypeError, match="homes"):
        deltafin.Model(model_dir, homes=str(home), **options)


def test_gpu_option(model, model_dir):
    # 40 prompt rows: one prefill pass whose routed experts run as grouped products on the GPU
    ids = list(range(3, 43))
    cpu = model.logits(ids)
    with pytest.raises(deltafin.ArgumentError, match="expected auto, off or a device index"):
        deltafin.Model(model_dir, gpu="seven", **OPTIONS)
    with pytest.raises(TypeError, match="gpu"):
        deltafin.Model(model_dir, gpu=1.5, **OPTIONS)
    with deltafin.Model(model_dir, gpu="auto", **OPTIONS) as m:
        if m.info["gpu"] is None:  # no GPU (lavapipe is only taken by index): the CPU's bits
            assert np.array_equal(m.logits(ids), cpu)
    try:
        m = deltafin.Model(model_dir, gpu=0, **OPTIONS)
    except deltafin.ArgumentError as e:
        if "no Vulkan" in str(e):
            pytest.skip(str(e))
        raise
    with m:
        assert m.info["gpu"].startswith("0: ")
        np.testing.assert_allclose(m.logits(ids), cpu, rtol=0, atol=2e-3)


def test_seeded_sampling_matches_run_json(model, binary, model_dir):
    args = dict(temperature=0.9, top_p=0.95, top_k=50, seed=42)
    cli = run_json(binary, model_dir, "--prompt", "Once upon a time", "--max-new", "12",
                   "--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--seed", "42")
    with model.session() as s:
        res = s.generate(model.tokenize("Once upon a time"), max_new_tokens=12, **args)
    assert res["completion_ids"] == cli["completion_ids"]
    assert res["seed"] == 42


def test_logits_equal_cli_bit_for_bit(model, binary, model_dir, tmp_path):
    ids = model.tokenize("The capital of France is")
    got = model.logits(ids)
    assert got.dtype == np.float32 and got.shape == (len(ids), model.vocab)
    out = tmp_path / "l.f32"
    subprocess.run([binary, "logits", "--model", model_dir, "--threads", "1", "--tokens",
                    ",".join(map(str, ids)), "--out", str(out)], check=True)
    want = np.fromfile(out, dtype="<f4").reshape(len(ids), model.vocab)
    assert got.tobytes() == want.tobytes()


def test_stream_concatenates_to_non_stream(model):
    kw = dict(prompt="In a hole in the ground", max_tokens=12, temperature=0.8, seed=7)
    whole = model.create_completion(**kw)
    chunks = list(model.create_completion(stream=True, **kw))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]

    msgs = [{"role": "user", "content": "Tell me a story"}]
    whole = model.create_chat_completion(messages=msgs, max_tokens=16, temperature=0)
    chunks = list(model.create_chat_completion(messages=msgs, max_tokens=16, temperature=0,
                                               stream=True))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or ""
                        for c in chunks)
    msg = whole["choices"][0]["message"]
    assert content == (msg.get("content") or "")
    assert reasoning == (msg.get("reasoning_content") or "")


def test_chat_completion_has_the_server_shape(model):
    out = model.create_chat_completion(
        messages=[{"role": "user", "content": "What is the weather?"}],
        tools=[{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {}}}}],
        reasoning_effort="low", max_tokens=8, temperature=0)
    assert out["object"] == "chat.completion"
    assert out["id"].startswith("chatcmpl-")
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert "content" in choice["message"]
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    assert set(out["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
    # The prompt is the server's rendering.
    ids = model.render_chat([{"role": "user", "content": "What is the weather?"}],
                            reasoning_effort="low", tools=[{"type": "function", "function": {
                                "name": "get_weather",
                                "parameters": {"type": "object", "properties": {}}}}])
    assert out["usage"]["prompt_tokens"] == len(ids)


@pytest.fixture()
def server(binary, model_dir):
    """`deltafin serve` on the same model, for comparing response shapes."""
    p = subprocess.Popen([binary, "serve", "--model", model_dir, "--port", "0", "--threads", "1",
                          "--memory-budget", "1G", "--ctx", "2048"],
                         stderr=subprocess.PIPE, text=True)
    port = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        m = re.search(r"listening on http://127.0.0.1:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "ready:" in line:
            break
    assert port, "the server did not start"
    yield f"http://127.0.0.1:{port}"
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def counts(usage):
    """The usage's token counts. `cached_tokens` is left out: it is what each process kept, and
    the server is another process, with snapshots of its own (the state-cache folder is the
    model's: one process at a time uses one)."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def test_chat_completion_parses_like_the_server(model, server):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    for req in ({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 24},
                {"messages": [{"role": "user", "content": "Weather?"}], "tools": tools,
                 "reasoning_effort": "low", "max_tokens": 24},
                {"messages": [{"role": "user", "content": "No thinking"}], "thinking": False,
                 "max_tokens": 16, "logprobs": True, "top_logprobs": 2}):
        req = dict(req, temperature=0)
        want = post(server + "/v1/chat/completions", req)
        got = model.create_chat_completion(**req)
        for k in ("object", "model"):
            assert (k in got) == (k in want)
        assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
        gm, wm = got["choices"][0]["message"], want["choices"][0]["message"]
        assert gm.get("content") == wm.get("content")
        assert gm.get("reasoning_content") == wm.get("reasoning_content")
        strip = lambda calls: [(c["type"], c["function"]) for c in calls or []]  # noqa: E731
        assert strip(gm.get("tool_calls")) == strip(wm.get("tool_calls"))
        assert counts(got["usage"]) == counts(want["usage"])
        assert set(got["usage"]) == set(want["usage"])
        assert got["choices"][0].get("logprobs") == want["choices"][0].get("logprobs")
    want = post(server + "/v1/completions", {"prompt": "Abc", "max_tokens": 9, "temperature": 0})
    got = model.create_completion(prompt="Abc", max_tokens=9, temperature=0)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert counts(got["usage"]) == counts(want["usage"])


def test_breaking_out_of_a_stream_stops_it(model):
    it = model.create_completion(prompt="Count", max_tokens=200, temperature=0, stream=True)
    first = next(it)
    assert first["object"] == "text_completion"
    it.close()  # what `break` does; the stream is freed and the model is free for the next call
    out = model.create_completion(prompt="Count", max_tokens=3, temperature=0)
    assert out["usage"]["completion_tokens"] == 3


def test_chat_session_reuses_state(model):
    with model.chat(thinking=False) as chat:
        a = chat.send("First question", max_tokens=6, temperature=0)
        assert chat.last_stats["reused_prompt_tokens"] == 0
        b = chat.send("Second question", max_tokens=6, temperature=0)
        reused = chat.last_stats["reused_prompt_tokens"]
        assert reused > 0
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == reused
        assert chat.last_stats["prompt_tokens"] < b["usage"]["prompt_tokens"]
        streamed = list(chat.send("Third", max_tokens=4, temperature=0, stream=True))
        assert streamed[-1]["choices"][0]["finish_reason"] is not None
        assert chat.last_stats["reused_prompt_tokens"] > reused
        assert len(chat.history()["messages"]) == 6
        assert a["choices"][0]["message"]["role"] == "assistant"


def test_a_k2_model_generates_as_the_cli_and_keeps_its_chat_state(binary, tmp_path):
    # `make-model --preset k2` (the K2 release's MLA with RoPE and FP8 layout, shrunk): the
    # package generates the CLI's greedy ids, and a chat in K2-Instruct's format continues its
    # second turn from the kept state (all of the first prompt but its generation prompt).
    d = str(tmp_path / "k2")
    subprocess.run([binary, "make-model", d, "--preset", "k2", "--layers", "2", "--experts", "8",
                    "--top-k", "2", "--hidden", "256", "--vocab", "512", "--quiet"], check=True)
    cli = run_json(binary, d, "--prompt", "The weather in Paris", "--max-new", "8")
    with deltafin.Model(d, **OPTIONS) as m:
        out = m.create_completion(prompt="The weather in Paris", max_tokens=8, temperature=0)
        assert m.last_stats["prompt_ids"] == cli["prompt_ids"]
        assert m.last_stats["completion_ids"] == cli["completion_ids"]
        assert out["choices"][0]["text"] == cli["text"]
        gen = len(m.tokenize("<|im_assistant|>assistant<|im_middle|>", special=True))
        assert gen < len("<|im_assistant|>assistant<|im_middle|>")
        with m.chat(thinking=False) as chat:
            a = chat.send("First question", max_tokens=4, temperature=0)
            assert chat.last_stats["reused_prompt_tokens"] == 0
            b = chat.send("Second question", max_tokens=4, temperature=0)
            reused = chat.last_stats["reused_prompt_tokens"]
            assert reused >= a["usage"]["prompt_tokens"] - gen
            assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == reused
            assert chat.last_stats["prompt_tokens"] < b["usage"]["prompt_tokens"]
            assert len(chat.history()["messages"]) == 4


def test_errors(model, model_dir, tmp_path):
    with pytest.raises(deltafin.Error, match="does not exist"):
        deltafin.Model(str(tmp_path / "missing"))
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(deltafin.Error, match="config.json"):
        deltafin.Model(str(bad))
    # A checkpoint whose shard is cut short.
    trunc = tmp_path / "truncated"
    subprocess.run(["cp", "-r", model_dir, str(trunc)], check=True)
    shard = sorted(p for p in os.listdir(trunc) if p.endswith(".safetensors"))[0]
    with open(trunc / shard, "r+b") as f:
        f.truncate(4096)
    with pytest.raises(deltafin.Error):
        deltafin.Model(str(trunc), **OPTIONS)
    with pytest.raises(TypeError, match="threads"):
        deltafin.Model(model_dir, threads="2")
    with pytest.raises(TypeError, match="path"):
        deltafin.Model(42)
    with pytest.raises(ValueError, match="memory_budget"):
        deltafin.Model(model_dir, memory_budget="lots")
    with pytest.raises(ValueError, match="fp8"):
        deltafin.Model(model_dir, trunk="fp8")
    with pytest.raises(TypeError):
        model.tokenize(123)
    with pytest.raises(TypeError):
        model.logits("not ids")
    with pytest.raises(ValueError, match="out of range"):
        model.logits([1, model.vocab + 5])
    with pytest.raises(deltafin.ArgumentError, match="frobnicate"):
        model.create_completion(prompt="x", frobnicate=1)
    with pytest.raises(deltafin.ArgumentError, match="temperature"):
        model.create_completion(prompt="x", temperature=5)
    with pytest.raises(deltafin.ContextLengthError, match="context"):
        model.create_completion(prompt=[65] * 2100, max_tokens=1)
    with pytest.raises(deltafin.ContextLengthError):
        model.logits([65] * 2100)
    with pytest.raises(TypeError):
        model.create_chat_completion(messages="hi")
    with pytest.raises(deltafin.ArgumentError, match="messages"):
        model.create_chat_completion(messages=[{"role": "wizard", "content": "x"}])
    # Closing a model closes what was made from it; using those then is an error, not a crash.
    other = deltafin.Model(model_dir, **OPTIONS)
    chat, session = other.chat(), other.session()
    it = other.create_completion(prompt="x", max_tokens=50, stream=True)
    next(it)
    other.close()
    with pytest.raises(deltafin.Error, match="closed"):
        chat.send("hello")
    with pytest.raises(deltafin.Error, match="closed"):
        session.eval([1])
    with pytest.raises(deltafin.Error, match="closed"):
        next(it)
    with pytest.raises(deltafin.Error, match="closed"):
        other.tokenize("x")
    # The model still works after all of that.
    assert model.create_completion(prompt="ok", max_tokens=2)["usage"]["completion_tokens"] == 2


def test_two_models_in_two_threads(model_dir):
    a = deltafin.Model(model_dir, **OPTIONS)
    b = deltafin.Model(model_dir, **OPTIONS)
    want = a.create_completion(prompt="Parallel", max_tokens=8, temperature=0)["choices"][0]
    got = {}

    def work(name, m):
        got[name] = m.create_completion(prompt="Parallel", max_tokens=8,
                                        temperature=0)["choices"][0]

    ts = [threading.Thread(target=work, args=(n, m)) for n, m in (("a", a), ("b", b))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got["a"]["text"] == want["text"] == got["b"]["text"]
    a.close()
    assert b.create_completion(prompt="Parallel", max_tokens=8,
                               temperature=0)["choices"][0]["text"] == want["text"]
    b.close()


def test_ctrl_c_raises_keyboard_interrupt_promptly(model_dir):
    # SIGINT once tokens are flowing: KeyboardInterrupt arrives between two passes, long before
    # the requested 8000 tokens (the count of chunks received says how far it got).
    script = textwrap.dedent(f"""
        import deltafin
        m = deltafin.Model({model_dir!r}, threads=1, memory_budget="1G", ctx=8192)
        n = 0
        try:
            for chunk in m.create_completion(prompt="go", max_tokens=8000, temperature=0,
                                             stream=True):
                n += 1
                if n == 1:
                    print("streaming", flush=True)
            print("finished", n, flush=True)
        except KeyboardInterrupt:
            print("interrupted", n, flush=True)
        # The model is still usable after the interrupted stream.
        print(m.create_completion(prompt="go", max_tokens=2)["usage"]["completion_tokens"])
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "streaming"
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    lines = out.split()
    assert lines[0] == "interrupted", out
    assert int(lines[1]) < 8000
    assert lines[2] == "2"
    assert p.returncode == 0


def test_callback_generation_stops_and_interrupts(model):
    seen = []
    with model.session() as s:
        res = s.generate(model.tokenize("Stop early"), max_new_tokens=50,
                         on_token=lambda i, t: seen.append(i) or len(seen) >= 4)
    assert res["completion_ids"] == seen and len(seen) == 4
    assert res["stop_reason"] == "cancelled"

    def boom(i, t):
        raise KeyboardInterrupt
    with model.session() as s, pytest.raises(KeyboardInterrupt):
        s.generate(model.tokenize("x"), max_new_tokens=50, on_token=boom)


def test_info_plan_stats(model):
    assert model.info["vocab"] == model.vocab
    assert model.memory_plan["context"] == 2048
    assert model.stats["passes"] > 0


PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "mood": {"enum": ["glad", "süß", "calm"]}},
          "required": ["name", "age", "mood"], "additionalProperties": False}


def check_person(text):
    v = json.loads(text)
    assert set(v) == {"name", "age", "mood"}, text
    assert isinstance(v["name"], str) and len(v["name"]) <= 12, text
    assert isinstance(v["age"], int) and 0 <= v["age"] <= 120, text
    assert v["mood"] in ("glad", "süß", "calm"), text


def test_structured_output(model):
    # The random-weight model at temperature 1: without the constraint the answer is never JSON.
    # A bias toward what closes strings, objects and argument tags lets every sample finish
    # within max_tokens (tests/structured_output_test.cpp, closing_bias); the constraint holds
    # whatever the logits.
    close = model.tokenize("<|close|>", special=True)
    assert len(close) == 1
    bias = {str(close[0]): 5}
    for text in ('"', "}"):
        ids = model.tokenize(text)
        if len(ids) == 1:
            bias[str(ids[0])] = 5
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for seed in range(1, 6):
        out = model.create_chat_completion(
            messages=[{"role": "user", "content": "Who?"}], response_format=fmt, thinking=False,
            temperature=1, seed=seed, max_tokens=600, logit_bias=bias)
        assert out["choices"][0]["finish_reason"] == "stop", out
        check_person(out["choices"][0]["message"]["content"])
    # llama-server's `grammar` field on completions (any server field passes as a keyword).
    for seed in range(1, 6):
        out = model.create_completion("Say:", grammar='root ::= ("yes" | "no") " " [0-9]{2}\n',
                                      temperature=1, seed=seed, max_tokens=50)
        assert re.fullmatch(r"(yes|no) [0-9]{2}", out["choices"][0]["text"]), out
    # A forced call: the arguments follow the function's parameters.
    tools = [{"type": "function", "function": {"name": "meet", "parameters": PERSON}}]
    out = model.create_chat_completion(
        messages=[{"role": "user", "content": "Meet"}], tools=tools, tool_choice="required",
        thinking=False, temperature=1, seed=3, max_tokens=600, logit_bias=bias)
    calls = out["choices"][0]["message"]["tool_calls"]
    assert out["choices"][0]["finish_reason"] == "tool_calls" and calls, out
    check_person(calls[0]["function"]["arguments"])
    # A chat session (deltafin_chat_send: the session renders the turns, so the schema comes as
    # llama-server's `json_schema` field), thinking on: thinking stays free, the answer is held.
    with model.chat(thinking=True) as chat:
        for seed in (1, 2):
            out = chat.send("Who?", json_schema=PERSON, temperature=1, seed=seed,
                            max_tokens=600, logit_bias=dict(bias, **{str(close[0]): 8}))
            assert out["choices"][0]["finish_reason"] == "stop", out
            check_person(out["choices"][0]["message"]["content"])
    with pytest.raises(deltafin.Error, match="uniqueItems"):
        model.create_chat_completion(
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "array", "uniqueItems": True}}})


def test_close_while_another_thread_generates(model_dir):
    # Issue 31 C1: Model.close(), Session.close() and Chat.close() from one thread while another
    # generates on the same handle. The generating call stops at its next pass and raises
    # deltafin.Error (or finishes first); the interpreter never crashes, double-frees or hangs.
    # Many rounds in a subprocess: a use after free shows as a signal or a timeout there.
    script = textwrap.dedent(f"""
        import threading, time
        import deltafin
        outcomes = {{"error": 0, "done": 0}}

        def generate(work, started):
            try:
                work(started)
                outcomes["done"] += 1
            except deltafin.Error:
                outcomes["error"] += 1

        def round_(kind, delay):
            m = deltafin.Model({model_dir!r}, threads=1, memory_budget="1G", ctx=4096)
            started = threading.Event()
            if kind == "model":
                def work(started):
                    for _ in m.create_completion(prompt="go", max_tokens=3000, temperature=0,
                                                 stream=True):
                        started.set()
                victim = m
            elif kind == "model-blocking":
                def work(started):
                    started.set()
                    m.create_chat_completion(messages=[{{"role": "user", "content": "go"}}],
                                             max_tokens=3000, temperature=0)
                victim = m
            elif kind == "session":
                s = m.session()
                def work(started):
                    s.generate([1, 2, 3], max_new_tokens=3000,
                               on_token=lambda i, t: started.set())
                victim = s
            else:
                c = m.chat()
                def work(started):
                    for _ in c.send("go", stream=True, max_tokens=3000, temperature=0):
                        started.set()
                victim = c
            t = threading.Thread(target=generate, args=(work, started))
            t.start()
            started.wait(60)
            time.sleep(delay)
            victim.close()
            t.join(120)
            assert not t.is_alive(), "the generating thread hangs after close()"
            m.close()

        for i in range(12):
            for kind in ("model", "model-blocking", "session", "chat"):
                round_(kind, (i % 4) * 0.002)
        print("ok", outcomes["error"], outcomes["done"], flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-2000:])
    words = p.stdout.split()
    assert words[0] == "ok", p.stdout
    assert int(words[1]) > 0, "no generation was stopped by close(): the test did not race"


def test_responses_report_timings(model):
    # Issue 31 B4: the server's llama.cpp-style timings, measured in-process too (they were all
    # zeros), in the response and in the usage chunk of a stream.
    out = model.create_chat_completion(messages=[{"role": "user", "content": "Time me"}],
                                       max_tokens=6, temperature=0)
    t, u = out["timings"], out["usage"]
    # prompt_n counts what was prefilled: the prompt less what a kept snapshot held.
    assert t["prompt_n"] == u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"] > 0
    assert t["predicted_n"] == u["completion_tokens"] == 6
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and t["ttft_ms"] > 0
    assert t["predicted_per_second"] > 0
    assert "draft_n" not in t  # no drafter on this model
    chunks = list(model.create_completion(prompt="Time me", max_tokens=4, temperature=0,
                                          stream=True, stream_options={"include_usage": True}))
    assert chunks[-1]["timings"]["predicted_n"] == 4 and chunks[-1]["timings"]["prompt_ms"] > 0


def test_the_demo_model_as_docs_python_says(binary, tmp_path):
    # Issue 31 B4: docs/PYTHON.md's way to the demo: any deltafin command without --model
    # unpacks it into $DELTAFIN_CACHE/demo-k3-english, which the package then loads.
    env = dict(os.environ, DELTAFIN_CACHE=str(tmp_path / "cache"))
    env.pop("DELTAFIN_MODEL", None)
    r = subprocess.run([binary, "inspect"], capture_output=True, text=True, env=env, check=True)
    folder = str(tmp_path / "cache" / "demo-k3-english")
    assert folder in r.stderr
    with deltafin.Model(folder, threads=1) as m:
        out = m.create_chat_completion(messages=[{"role": "user", "content": "Tell me a fortune."}],
                                       max_tokens=8, seed=1)
        assert out["usage"]["completion_tokens"] >= 1
        assert out["timings"]["predicted_n"] == out["usage"]["completion_tokens"]
        # B4: with no `draft` the package drafts with the folder's draft/ as the CLI does (the
        # demo carries one): the timings carry the drafting figures.
        assert out["timings"]["target_passes"] >= 1, out["timings"]


def test_threads_beyond_the_cpus_are_capped(model_dir):
    # Issue 31 C2: threads=100000 ended the interpreter (std::terminate from thread creation);
    # the library caps it with a warning as the CLI does. In a subprocess, so a crash is seen.
    script = textwrap.dedent(f"""
        import deltafin
        with deltafin.Model({model_dir!r}, threads=100000) as m:
            out = m.create_completion(prompt="go", max_tokens=2, temperature=0)
        print("ok", out["usage"]["completion_tokens"], flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-2000:])
    assert p.stdout.split() == ["ok", "2"], p.stdout
    assert "100000 compute threads are more than" in p.stderr, p.stderr


def _png(w, h):
    """An 8-bit RGB PNG of w x h (a gradient), written with zlib: no imaging library needed."""
    rows = b"".join(b"\0" + bytes(v for x in range(w) for v in (x * 7 % 256, y * 11 % 256,
                                                                 (x + y) % 256))
                    for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_images_as_bytes_and_paths_on_the_demo(binary, tmp_path):
    # Issue 38: the demo sees images by default (a random tower); the package takes images as
    # bytes or paths (Chat.send) and as OpenAI image_url parts (image_part). The stats show
    # they reached the prompt: counted, their tokens, encoded by the tower or kept.
    env = dict(os.environ, DELTAFIN_CACHE=str(tmp_path / "cache"))
    env.pop("DELTAFIN_MODEL", None)
    subprocess.run([binary, "inspect"], capture_output=True, text=True, env=env, check=True)
    png = _png(100, 60)
    path = tmp_path / "picture.png"
    path.write_bytes(png)
    with deltafin.Model(str(tmp_path / "cache" / "demo-k3-english"), threads=1) as m:
        assert m.has_vision
        chat = m.chat(thinking=False)
        out = chat.send("What are these?", images=[png, path], max_tokens=3, temperature=0)
        assert out["usage"]["completion_tokens"] == 3
        st = chat.last_stats
        assert st["images"] == 2 and st["images_encoded"] == 2, st
        per_image = st["image_tokens"] // 2
        assert per_image > 0 and st["image_tokens"] == 2 * per_image
        assert out["usage"]["prompt_tokens"] > st["image_tokens"]
        # Bad images: each raises naming it, and none of a failed send's images stays attached.
        with pytest.raises(deltafin.ArgumentError, match=r"images\[0\]"):
            chat.send("Cut?", images=[png[: len(png) // 2]], max_tokens=2)
        with pytest.raises(deltafin.ArgumentError, match="missing.png"):
            chat.send("Gone?", images=[png, tmp_path / "missing.png"], max_tokens=2)
        with pytest.raises(deltafin.ArgumentError, match="not a regular file"):
            chat.send("Folder?", images=[tmp_path], max_tokens=2)
        with pytest.raises(deltafin.ArgumentError, match="no bytes"):
            chat.send("Empty?", images=[b""], max_tokens=2)
        with pytest.raises(TypeError):
            chat.send("Number?", images=[42], max_tokens=2)
        with pytest.raises(TypeError):
            chat.send("One?", images=png, max_tokens=2)
        chat.send("And now?", max_tokens=2, temperature=0)
        st = chat.last_stats
        assert st["images"] == 2 and st["images_encoded"] == 0, st  # the first turn's, kept
        # OpenAI image_url parts from a path and from bytes.
        for src in (path, png):
            part = deltafin.image_part(src, detail="low")
            assert part["image_url"]["url"].startswith("data:image/png;base64,")
            out = m.create_chat_completion(
                messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}],
                max_tokens=2, temperature=0)
            assert out["usage"]["completion_tokens"] == 2
            assert m.last_stats["images"] == 1 and m.last_stats["image_tokens"] == per_image
        with pytest.raises(deltafin.ArgumentError, match="not a PNG, JPEG, WebP or GIF"):
            deltafin.image_part(b"plain text")
        with pytest.raises(deltafin.ArgumentError, match="cannot read"):
            deltafin.image_part(tmp_path / "missing.png")
        with pytest.raises(deltafin.ArgumentError, match=r"messages\[0\]\.content\[1\]"):
            m.create_chat_completion(messages=[{"role": "user", "content": [
                {"type": "text", "text": "Hi"},
                deltafin.image_part(png[:40] + b"\0" * 10)]}], max_tokens=2)


def test_a_text_only_model_refuses_images(model, model_dir):
    assert not model.has_vision
    chat = model.chat()
    with pytest.raises(deltafin.ArgumentError, match="no vision tower"):
        chat.send("Hi", images=[_png(8, 8)], max_tokens=2)
    out = chat.send("Hi", max_tokens=2, temperature=0)  # nothing stayed attached
    assert out["usage"]["completion_tokens"] == 2
