"""Deltafin in-process: run Kimi K3 (or any Deltafin checkpoint) from Python.

    import deltafin
    model = deltafin.Model("/path/to/Kimi-K3", memory_budget="48G")
    out = model.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])
    print(out["choices"][0]["message"]["content"])

The package is a thin layer over the C API (libdeltafin.so, bundled at install): requests and
responses are exactly the OpenAI-compatible server's (`deltafin serve`), generation settings
are the CLI's, and errors raise `deltafin.Error` (or a subclass that is also a ValueError for
bad arguments) with the engine's message. See docs/PYTHON.md for every call.

Images (a model with K3's vision tower, `Model.has_vision`): `Chat.send(text, images=[...])`
takes paths or bytes; a chat request's messages take OpenAI `image_url` parts, which
`deltafin.image_part(path_or_bytes)` builds as a data URL. The library checks every image.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import threading
import weakref
from ctypes import POINTER, byref, c_char_p, c_int, c_int32, c_size_t, c_void_p
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ._capi import (TOKEN_CALLBACK, ArgumentError, ContextLengthError, Error, IoError,
                    ModelError, ModelParams, OutOfMemoryError, SamplingParams, check, lib,
                    take_bytes, take_ids)

__version__ = lib.deltafin_version().decode()
__all__ = ["Model", "Session", "Chat", "image_part", "Error", "ArgumentError", "ContextLengthError",
           "IoError", "ModelError", "OutOfMemoryError", "abi_version", "__version__"]


def abi_version() -> int:
    """The C ABI version of the loaded libdeltafin.so."""
    return lib.deltafin_abi_version()


# --- argument checking: wrong types are TypeError, bad values ValueError (ArgumentError) ---

def _int(name: str, v: Any, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if lo is not None and v < lo:
        raise ArgumentError(f"{name}: expected an int >= {lo}, got {v}", 1)
    return int(v)


def _num(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number, got {type(v).__name__}")
    return float(v)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {type(v).__name__}")
    return bool(v)


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected a str, got {type(v).__name__}")
    return v


def _ids(name: str, ids: Any) -> ctypes.Array:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray)):
        raise TypeError(f"{name}: expected a list of token ids (ints), got {type(ids).__name__}")
    vals = []
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{name}[{i}]: expected an int token id, got {type(t).__name__}")
        if not 0 <= int(t) < 2**31:
            raise ArgumentError(f"{name}[{i}]: token id {t} is out of range", 1)
        vals.append(int(t))
    return (c_int32 * len(vals))(*vals)


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*$", re.I)


# What an image may be on the Python side before the library sees it (the library checks it
# again, and decodes it): the C API's and the server's per-image limit.
_MAX_IMAGE_BYTES = 20 << 20
_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
                (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


def _image(name: str, image: Any) -> tuple[bytes | None, str | None, str]:
    """An image argument: (bytes, None, label) or (None, path, label); checks its type."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        if not data:
            raise ArgumentError(f"{name}: no bytes; expected a PNG, JPEG, WebP or GIF file", 1)
        if len(data) > _MAX_IMAGE_BYTES:
            raise ArgumentError(f"{name}: {len(data)} bytes; an image may have at most "
                                f"{_MAX_IMAGE_BYTES} bytes", 1)
        return data, None, name
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        if not path or "\0" in path:
            raise ArgumentError(f"{name}: expected a file path, got {path!r}", 1)
        return None, path, path
    raise TypeError(f"{name}: expected a path (str or os.PathLike) or the image's bytes, got "
                    f"{type(image).__name__}")


def image_part(image: str | os.PathLike | bytes, detail: str | None = None) -> dict:
    """An OpenAI chat content part for `image` (a path or the file's bytes): {"type":
    "image_url", "image_url": {"url": "data:image/...;base64,..."}}, for
    create_chat_completion's messages. The type comes from the bytes (PNG, JPEG, WebP, GIF);
    a file is checked to be a regular file of at most 20 MiB before it is read. The library
    decodes and checks the image itself when the request runs."""
    import base64
    import stat
    data, path, label = _image("image", image)
    if path is not None:
        try:
            st = os.stat(path)
        except OSError as e:
            raise ArgumentError(f"{path}: cannot read the image ({e.strerror})", 1) from None
        if not stat.S_ISREG(st.st_mode):
            raise ArgumentError(f"{path}: not a regular file", 1)
        if st.st_size > _MAX_IMAGE_BYTES:
            raise ArgumentError(f"{path}: {st.st_size} bytes; an image may have at most "
                                f"{_MAX_IMAGE_BYTES} bytes", 1)
        with open(path, "rb") as f:
            data = f.read(_MAX_IMAGE_BYTES + 1)
        if len(data) > _MAX_IMAGE_BYTES:
            raise ArgumentError(f"{path}: grew past {_MAX_IMAGE_BYTES} bytes while read", 1)
    mime = next((m for magic, m in _IMAGE_MAGIC if data.startswith(magic)), None)
    if mime is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        mime = "image/webp"
    if mime is None:
        raise ArgumentError(f"{label}: not a PNG, JPEG, WebP or GIF image (first bytes "
                            f"{data[:8].hex()})", 1)
    url = {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}
    if detail is not None:
        url["detail"] = _str("detail", detail)
    return {"type": "image_url", "image_url": url}


def _budget(v: Any, name: str = "memory_budget") -> int:
    """48G, 512M, 1.5 (GiB), or an int of bytes -> bytes (the CLI's --memory-budget)."""
    if v is None:
        return 0
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        if v <= 0:
            raise ArgumentError(f"{name}: expected a positive size, got {v}", 1)
        return int(v)
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected a size such as '48G' or an int of bytes, "
                        f"got {type(v).__name__}")
    m = _SIZE.match(v)
    if not m or float(m.group(1)) <= 0:
        raise ArgumentError(f"{name}: \"{v}\" is not a size (expected a positive number "
                            "with an optional K, M, G or T suffix; a bare number means GiB)", 1)
    mult = {"": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(m.group(1)) * mult[m.group(2).upper()])


def _json_out(fn: Callable, *args: Any) -> Any:
    out = c_void_p()
    check(fn(*args, byref(out)))
    return json.loads(take_bytes(out))


def _body(fields: Mapping[str, Any], extra: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in fields.items() if v is not None}
    body.update(extra)
    try:
        return json.dumps(body).encode()
    except (TypeError, ValueError) as e:
        raise TypeError(f"request: a field is not JSON-serialisable: {e}") from None


_CLOSING = threading.Lock()


class _Handle:
    """An owned C handle: freed by close(), a `with` block, or garbage collection."""

    _h: c_void_p | None = None
    _free: Callable[[c_void_p], None]
    _children: "weakref.WeakSet[_Handle] | None" = None

    def _adopt(self, child: "_Handle") -> None:
        # Children (sessions, chats, streams) are closed before their parent is freed, so an
        # early close() can never leave the library a dangling handle.
        with _CLOSING:
            if self._children is None:
                self._children = weakref.WeakSet()
            self._children.add(child)

    def close(self) -> None:
        """Frees the handle now (and first what was made from it). Safe while another thread
        is using it: a call in progress there stops at its next forward pass and raises
        deltafin.Error, and the library frees the memory when that call has returned."""
        with _CLOSING:
            children = list(self._children or ())
        for child in children:
            child.close()
        with _CLOSING:  # one thread takes the handle, so it is freed once
            h, self._h = self._h, None
        if h is not None and h.value:
            type(self)._free(h)

    def __del__(self) -> None:
        self.close()

    def _handle(self) -> c_void_p:
        if self._h is None or not self._h.value:
            raise Error(f"this {type(self).__name__} was closed", 1)
        return self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Stream(_Handle):
    """Owns a deltafin_stream; iterating yields the server's chunks, one pass per C call."""

    def __init__(self, handle: c_void_p):
        self._h = handle
        self.stats: dict | None = None

    def chunks(self) -> Iterator[dict]:
        try:
            while True:
                chunk, done = c_void_p(), c_int()
                check(lib.deltafin_stream_next(self._handle(), byref(chunk), byref(done)))
                if chunk.value:
                    yield json.loads(take_bytes(chunk))
                if done.value:
                    self.stats = _json_out(lib.deltafin_stream_stats_json, self._handle())
                    return
        finally:
            self.close()

    def response(self) -> dict:
        try:
            while True:  # one pass per call, so Ctrl-C lands between passes
                chunk, done = c_void_p(), c_int()
                check(lib.deltafin_stream_next(self._handle(), byref(chunk), byref(done)))
                take_bytes(chunk)
                if done.value:
                    break
            self.stats = _json_out(lib.deltafin_stream_stats_json, self._handle())
            return _json_out(lib.deltafin_stream_response, self._handle())
        finally:
            self.close()

    _free = lib.deltafin_stream_free


class Model(_Handle):
    """A loaded checkpoint. Engine options are the CLI's engine flags (README, "Engine options").

    Args:
        path: checkpoint folder (config.json, safetensors shards; tiktoken.model and
            tokenizer_config.json for text, chat and the OpenAI-shaped calls).
        threads: compute threads of this model (0 = one per physical core).
        kernels: "scalar", "avx2", "avx512" or "neon" (process-wide; default: the best).
        memory_budget: RAM for the model, e.g. "48G", "1.5" (GiB) or an int of bytes.
        mmap: map the shards instead of the budgeted store.
        cache_policy: "lru", "lfu" or "pinned".
        readers: reader threads; prefetch / direct_io: as the CLI's --no-prefetch/--no-direct-io.
        trunk: "bf16" (exact) or "int8" (lossy).
        ctx: context positions per sequence to plan for (0 = min(model, 8192)).
        sequences: sessions/chats/streams alive at once to plan memory for.
        max_rows: rows per forward pass to plan for (the prefill chunk); 0 = auto, as many as
            the memory budget holds (as the CLI's --prefill-chunk auto).
        verbose: print the memory plan to stderr.
        heat_file: where expert heat counts persist (for cache_policy="pinned").
        draft: speculative decoding: None (default: the model folder's draft/ subfolder when it
            has one, as the CLI does — the built-in demo ships its trained EAGLE-3.1 drafter —
            else none), "none", "ngram" (prompt lookup), "mtp" (DeepSeek-V3's own MTP
            layer) or a draft model folder (EAGLE-3.x, DSpark; counted in the memory budget);
            the output is the same with it (greedy token for token, seeded sampling too).
        draft_max: most drafts verified per pass (0 = auto, from measured pass costs).
        state_cache: prefix snapshots of sequence states, so a prompt that starts with a kept
            prefix (the conversation so far with create_chat_completion, a shared system
            prompt) prefills only the rest: None (default: states/ in the cache folder),
            "none" (no reuse) or a folder. state_cache_size: disk bytes (or "16G"; 0 = RAM
            only); state_cache_ram: bytes of the memory budget (None = auto; 0 = disk only).
        gpu: the Vulkan GPU for the matrix products, as the CLI's --gpu: "off" (default),
            "auto" (a GPU if there is one) or a device index such as "0" (an int works too).
            fp32 throughout; `info["gpu"]` names the device used (None: the CPU).
        homes: folders on other drives holding copies of experts (`deltafin place` fills
            them), as the CLI's --home; reads go to whichever copy finishes first, the output
            is the same. `stats["homes"]` has each drive's reads, bytes and GB/s.

    A Model may be used from several threads (passes are serialised per model); separate
    Models run in parallel. Use `with deltafin.Model(...) as m:` or `close()` to free it early.
    """

    def __init__(self, path: str | os.PathLike, *, threads: int = 0, kernels: str | None = None,
                 memory_budget: str | int | None = None, mmap: bool = False,
                 cache_policy: str = "lru", readers: int = 4, prefetch: bool = True,
                 direct_io: bool = True, trunk: str = "bf16", ctx: int = 0, sequences: int = 1,
                 max_rows: int = 0, verbose: bool = False, heat_file: str | None = None,
                 draft: str | os.PathLike | None = None, draft_max: int = 0,
                 gpu: str | int = "off", state_cache: str | os.PathLike | None = None,
                 state_cache_size: str | int = "16G", state_cache_ram: str | int | None = None,
                 homes: list[str | os.PathLike] | tuple = ()):
        self._h = c_void_p()
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a folder path, got {type(path).__name__}")
        p = ModelParams()
        lib.deltafin_model_params_init(byref(p))
        p.threads = _int("threads", threads, 0)
        self._kernels = None if kernels is None else _str("kernels", kernels).encode()
        p.kernels = self._kernels
        p.memory_budget = _budget(memory_budget)
        p.mmap = _bool("mmap", mmap)
        self._policy = _str("cache_policy", cache_policy).encode()
        p.cache_policy = self._policy
        p.readers = _int("readers", readers, 1)
        p.prefetch = _bool("prefetch", prefetch)
        p.direct_io = _bool("direct_io", direct_io)
        self._trunk = _str("trunk", trunk).encode()
        p.trunk = self._trunk
        p.ctx = _int("ctx", ctx, 0)
        p.sequences = _int("sequences", sequences, 1)
        p.max_rows = _int("max_rows", max_rows, 0)
        p.verbose = _bool("verbose", verbose)
        self._heat = None if heat_file is None else _str("heat_file", heat_file).encode()
        p.heat_file = self._heat
        self._draft = None if draft is None else (
            os.fspath(draft) if isinstance(draft, os.PathLike) else _str("draft", draft)).encode()
        p.draft = self._draft
        p.draft_max = _int("draft_max", draft_max, 0)
        if isinstance(gpu, int) and not isinstance(gpu, bool):
            gpu = str(_int("gpu", gpu, 0))
        self._gpu = _str("gpu", gpu).encode()
        p.gpu = self._gpu
        self._state_cache = None if state_cache is None else (
            os.fspath(state_cache) if isinstance(state_cache, os.PathLike)
            else _str("state_cache", state_cache)).encode()
        p.state_cache = self._state_cache
        p.state_cache_size = (0 if state_cache_size == 0
                              else _budget(state_cache_size, "state_cache_size"))
        p.state_cache_ram = -1 if state_cache_ram is None else (
            0 if state_cache_ram == 0 else _budget(state_cache_ram, "state_cache_ram"))
        if isinstance(homes, (str, bytes, os.PathLike)) or not isinstance(homes, (list, tuple)):
            raise TypeError(f"homes: expected a list of folder paths, got {type(homes).__name__}")
        for h in homes:
            if not isinstance(h, (str, os.PathLike)):
                raise TypeError(f"homes: expected folder paths, got {type(h).__name__}")
        self._homes = (c_char_p * max(1, len(homes)))(*[os.fsencode(h) for h in homes])
        p.homes = ctypes.cast(self._homes, POINTER(c_char_p))
        p.n_homes = len(homes)
        self.path = os.fspath(path)
        self._local = threading.local()
        check(lib.deltafin_model_load(self.path.encode(), byref(p), byref(self._h)))
        self.vocab: int = lib.deltafin_model_vocab(self._handle())
        """Vocabulary size (the length of a logits row)."""
        self.context: int = lib.deltafin_model_context(self._handle())
        """Positions a sequence may reach."""

    # close() frees the model now: sessions, chats and iterators made from it must be done.
    _free = lib.deltafin_model_free

    # -- information --
    @property
    def has_vision(self) -> bool:
        """True when the checkpoint has K3's vision tower and projector (it takes images)."""
        return bool(lib.deltafin_model_has_vision(self._handle()))

    @property
    def info(self) -> dict:
        """Config figures, context, stop ids, kernel set and storage description."""
        return _json_out(lib.deltafin_model_info_json, self._handle())

    @property
    def memory_plan(self) -> dict | None:
        """How the memory budget is divided (None with mmap=True)."""
        return _json_out(lib.deltafin_model_memory_plan_json, self._handle())

    @property
    def stats(self) -> dict:
        """Counters since load: passes, expert hits/misses/bytes read, trunk streaming, RSS, and
        with homes "homes": per drive its reads, bytes, busy seconds and GB/s."""
        return _json_out(lib.deltafin_model_stats_json, self._handle())

    # -- tokens --
    def tokenize(self, text: str | bytes, special: bool = False) -> list[int]:
        """Text -> token ids. special=True turns special-token strings such as <|end_of_msg|>
        into their ids (trusted text only); otherwise all text is ordinary."""
        if isinstance(text, str):
            data = text.encode("utf-8", "surrogatepass")
        elif isinstance(text, (bytes, bytearray)):
            data = bytes(text)
        else:
            raise TypeError(f"text: expected a str or bytes, got {type(text).__name__}")
        out, n = c_void_p(), c_size_t()
        check(lib.deltafin_tokenize(self._handle(), data, len(data), int(_bool("special", special)),
                                    byref(out), byref(n)))
        return take_ids(out, n.value)

    def detokenize_bytes(self, ids: Sequence[int]) -> bytes:
        """Token ids -> the exact bytes (special ids decode to their names)."""
        arr = _ids("ids", ids)
        out, n = c_void_p(), c_size_t()
        check(lib.deltafin_detokenize(self._handle(), arr, len(arr), byref(out), byref(n)))
        return take_bytes(out, n.value)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Token ids -> text (an incomplete UTF-8 character becomes U+FFFD)."""
        return self.detokenize_bytes(ids).decode("utf-8", "replace")

    def render_chat(self, messages: list, **request: Any) -> list[int]:
        """A chat request (messages, tools, tool_choice, response_format, reasoning_effort,
        thinking, add_generation_prompt) -> the exact K3 prompt ids the server would feed."""
        body = _body({"messages": messages}, request)
        out, n = c_void_p(), c_size_t()
        check(lib.deltafin_render_chat(self._handle(), body, byref(out), byref(n), None))
        return take_ids(out, n.value)

    # -- evaluation --
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits [len(ids), vocab] float32 of `ids` from an empty state, in one prefill pass
        (row t = the logits after ids[0..t]); bit for bit what `deltafin logits` writes."""
        with self.session() as s:
            return s.eval(ids, all_logits=True)

    def session(self) -> "Session":
        """A fresh sequence state for low-level eval and generation."""
        return Session(self)

    # -- OpenAI-shaped --
    def create_completion(self, prompt: str | Sequence[int], *, max_tokens: int | None = None,
                          temperature: float | None = None, top_p: float | None = None,
                          top_k: int | None = None, min_p: float | None = None,
                          seed: int | None = None, stop: str | list[str] | None = None,
                          presence_penalty: float | None = None,
                          frequency_penalty: float | None = None,
                          repetition_penalty: float | None = None,
                          logit_bias: dict | None = None, logprobs: int | None = None,
                          stream: bool = False, **extra: Any) -> dict | Iterator[dict]:
        """A /v1/completions request in-process: returns the server's `text_completion` dict,
        or with stream=True an iterator of the chunks it would stream (breaking out of it stops
        generation). Omitted fields take the server's defaults (max_tokens 16, temperature 1);
        other server fields can be passed as keywords (validated exactly as the server does)."""
        if not isinstance(prompt, (str, list, tuple)):
            raise TypeError(f"prompt: expected a str or a list of token ids, got "
                            f"{type(prompt).__name__}")
        fields = dict(prompt=list(prompt) if not isinstance(prompt, str) else prompt,
                      max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                      min_p=min_p, seed=seed, stop=stop, presence_penalty=presence_penalty,
                      frequency_penalty=frequency_penalty,
                      repetition_penalty=repetition_penalty, logit_bias=logit_bias,
                      logprobs=logprobs, stream=_bool("stream", stream) or None)
        return self._run(_body(fields, extra), 0, stream)

    def create_chat_completion(self, messages: list, *, tools: list | None = None,
                               tool_choice: Any = None, reasoning_effort: str | None = None,
                               thinking: bool | None = None, response_format: dict | None = None,
                               max_tokens: int | None = None, temperature: float | None = None,
                               top_p: float | None = None, top_k: int | None = None,
                               min_p: float | None = None, seed: int | None = None,
                               stop: str | list[str] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None, stream: bool = False,
                               **extra: Any) -> dict | Iterator[dict]:
        """A /v1/chat/completions request in-process: returns the server's `chat.completion`
        dict (message.content, message.reasoning_content, message.tool_calls), or with
        stream=True an iterator of its `chat.completion.chunk`s. Other server fields
        (presence_penalty, logit_bias, stream_options, ...) can be passed as keywords."""
        if not isinstance(messages, list):
            raise TypeError(f"messages: expected a list of message dicts, got "
                            f"{type(messages).__name__}")
        fields = dict(messages=messages, tools=tools, tool_choice=tool_choice,
                      reasoning_effort=reasoning_effort, thinking=thinking,
                      response_format=response_format, max_tokens=max_tokens,
                      temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                      stop=stop, logprobs=logprobs, top_logprobs=top_logprobs,
                      stream=_bool("stream", stream) or None)
        return self._run(_body(fields, extra), 1, stream)

    @property
    def last_stats(self) -> dict | None:
        """Of the last create_completion / create_chat_completion this thread finished on this
        model: prompt_ids, completion_ids and the stats fields of `deltafin run --json`."""
        return getattr(self._local, "stats", None)

    def _run(self, body: bytes, chat: int, stream: bool) -> dict | Iterator[dict]:
        h = c_void_p()
        check(lib.deltafin_stream_start(self._handle(), body, chat, byref(h)))
        s = _Stream(h)
        self._adopt(s)
        if not stream:
            out = s.response()
            self._local.stats = s.stats
            return out

        def chunks() -> Iterator[dict]:
            yield from s.chunks()
            self._local.stats = s.stats
        return chunks()

    def chat(self, *, system: str | None = None, reasoning_effort: str | None = None,
             thinking: bool | None = None) -> "Chat":
        """A conversation that keeps its model state across turns, like `deltafin chat`."""
        return Chat(self, system=system, reasoning_effort=reasoning_effort, thinking=thinking)


class Session(_Handle):
    """One sequence's model state and the ids it consumed (low level: eval and generate)."""

    def __init__(self, model: Model):
        self.model = model
        self._h = c_void_p()
        check(lib.deltafin_session_new(model._handle(), byref(self._h)))
        model._adopt(self)

    _free = lib.deltafin_session_free

    @property
    def position(self) -> int:
        """Tokens in the sequence so far."""
        return lib.deltafin_session_position(self._handle())

    def history(self) -> list[int]:
        """Every id of the sequence, in order."""
        out, n = c_void_p(), c_size_t()
        check(lib.deltafin_session_history(self._handle(), byref(out), byref(n)))
        return take_ids(out, n.value)

    def reset(self) -> None:
        """Empties the state."""
        lib.deltafin_session_reset(self._handle())

    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Feeds `ids` in one pass; returns the last row's logits [vocab] or, with all_logits,
        [len(ids), vocab] (float32)."""
        arr = _ids("ids", ids)
        if len(arr) == 0:
            raise ArgumentError("ids: evaluate at least one token", 1)
        all_rows = _bool("all_logits", all_logits)
        out = np.empty((len(arr), self.model.vocab) if all_rows else (self.model.vocab,),
                       dtype=np.float32)
        check(lib.deltafin_session_eval(self._handle(), arr, len(arr), int(all_rows),
                                        out.ctypes.data_as(c_void_p)))
        return out

    def generate(self, ids: Sequence[int], *, max_new_tokens: int = 256,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, repeat_penalty: float = 1.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 seed: int | None = None, stop: Sequence[str] = (), prefill_chunk: int = 0,
                 chat: bool = False,
                 on_token: Callable[[int, str], bool | None] | None = None) -> dict:
        """Feeds `ids`, then generates with `deltafin run`'s settings (same names and defaults).
        `on_token(id, text)` is called per token; returning True stops generation.
        `prefill_chunk` 0 takes the model's pass rows (see `max_rows`). Returns the
        object `deltafin run --json` prints (completion_ids, text, stop_reason, stats)."""
        arr = _ids("ids", ids)
        p = SamplingParams()
        lib.deltafin_sampling_params_init(byref(p))
        p.max_new_tokens = _int("max_new_tokens", max_new_tokens, 0)
        p.temperature = _num("temperature", temperature)
        p.top_k = _int("top_k", top_k, 0)
        p.top_p = _num("top_p", top_p)
        p.min_p = _num("min_p", min_p)
        p.repeat_penalty = _num("repeat_penalty", repeat_penalty)
        p.presence_penalty = _num("presence_penalty", presence_penalty)
        p.frequency_penalty = _num("frequency_penalty", frequency_penalty)
        if seed is not None:
            p.seed = _int("seed", seed) & (2**64 - 1)
            p.has_seed = 1
        if isinstance(stop, str):
            stop = [stop]
        stops = [_str("stop[]", s).encode() for s in stop]
        arr_stop = (c_char_p * len(stops))(*stops)
        p.stop = ctypes.cast(arr_stop, POINTER(c_char_p))
        p.n_stop = len(stops)
        p.prefill_chunk = _int("prefill_chunk", prefill_chunk, 0)
        p.chat = _bool("chat", chat)
        raised: list[BaseException] = []

        def trampoline(ev_ptr: Any, _user: Any) -> int:
            # An exception (Ctrl-C included) cannot cross C: stop generation, re-raise after.
            try:
                ev = ev_ptr.contents
                text = ctypes.string_at(ev.text, ev.text_len).decode("utf-8", "replace")
                return 1 if on_token is not None and on_token(ev.id, text) else 0
            except BaseException as e:  # noqa: B036
                raised.append(e)
                return 1

        cb = TOKEN_CALLBACK(trampoline) if on_token is not None else TOKEN_CALLBACK()
        out = c_void_p()
        status = lib.deltafin_session_generate(self._handle(), arr, len(arr), byref(p), cb, None,
                                               byref(out))
        if raised:
            take_bytes(out)
            raise raised[0]
        check(status)
        return json.loads(take_bytes(out))


class Chat(_Handle):
    """A multi-turn conversation over one kept model state (like `deltafin chat`): each turn
    feeds only its new tokens; `last_stats["reused_prompt_tokens"]` and the response's
    usage.prompt_tokens_details.cached_tokens say how many were reused."""

    def __init__(self, model: Model, *, system: str | None = None,
                 reasoning_effort: str | None = None, thinking: bool | None = None):
        self.model = model
        self.last_stats: dict | None = None
        opts = {}
        if system is not None:
            opts["system"] = _str("system", system)
        if reasoning_effort is not None:
            opts["reasoning_effort"] = _str("reasoning_effort", reasoning_effort)
        if thinking is not None:
            opts["thinking"] = _bool("thinking", thinking)
        self._h = c_void_p()
        check(lib.deltafin_chat_new(model._handle(), json.dumps(opts).encode(), byref(self._h)))
        model._adopt(self)

    _free = lib.deltafin_chat_free

    def send(self, content: str, *, images: Sequence[Any] = (), stream: bool = False,
             max_tokens: int | None = None, temperature: float | None = None,
             top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
             stop: str | list[str] | None = None, **extra: Any) -> dict | Iterator[dict]:
        """The user's next message; returns the `chat.completion` dict (or, with stream=True,
        an iterator of chunks). The answer joins the conversation when the turn ends.
        `images`: paths or bytes of PNG, JPEG, WebP or GIF files (a model with a vision tower),
        placed before the text; each is checked before anything is sent, and on any error
        none of them stays attached."""
        fields = dict(content=_str("content", content), max_tokens=max_tokens,
                      temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                      stream=_bool("stream", stream) or None)
        if isinstance(images, (str, bytes, bytearray, os.PathLike)):
            raise TypeError("images: expected a list of paths or bytes, not one image")
        images = list(images)
        body = _body(fields, extra)
        h = c_void_p()
        try:
            for i, im in enumerate(images):
                data, path, label = _image(f"images[{i}]", im)
                if path is not None:
                    check(lib.deltafin_chat_add_image_file(self._handle(), os.fsencode(path)))
                else:
                    check(lib.deltafin_chat_add_image(self._handle(), data, len(data),
                                                      label.encode()))
            check(lib.deltafin_chat_send(self._handle(), body, byref(h)))
        finally:
            if not h.value:
                lib.deltafin_chat_clear_images(self._handle())
        s = _Stream(h)
        self._adopt(s)
        if not stream:
            out = s.response()
            self.last_stats = s.stats
            return out

        def chunks() -> Iterator[dict]:
            yield from s.chunks()
            self.last_stats = s.stats
        return chunks()

    def history(self) -> dict:
        """The conversation: {"messages": [...], "thinking": ..., "reasoning_effort": ...}."""
        return _json_out(lib.deltafin_chat_history_json, self._handle())

    def reset(self) -> None:
        """Forgets the conversation."""
        lib.deltafin_chat_reset(self._handle())
