"""ctypes declarations of libdeltafin.so (include/deltafin/deltafin.h) and its error mapping.

Why ctypes: the C API is the stable surface, and ctypes binds it with nothing to compile at
install time. Every foreign call releases the GIL, so models used from several threads run in
parallel; long work is split into calls of one forward pass each, so Python sees Ctrl-C between
passes.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t,
                    c_uint64, c_void_p)

ABI_VERSION = 1


class Error(Exception):
    """An error reported by the engine; `status` is the C API's deltafin_status code."""

    def __init__(self, message: str, status: int = 6):
        super().__init__(message)
        self.status = status


class ArgumentError(Error, ValueError):
    """A bad argument, option or request field (the message names it)."""


class ContextLengthError(ArgumentError):
    """The tokens do not fit in the model's context."""


class IoError(Error):
    """A model file could not be read (missing, short, replaced)."""


class ModelError(Error):
    """The engine refused: a corrupt checkpoint, a memory budget below the working set, ..."""


class OutOfMemoryError(Error, MemoryError):
    """The engine ran out of memory."""


_BY_STATUS = {1: ArgumentError, 2: IoError, 3: ModelError, 4: ContextLengthError,
              5: OutOfMemoryError}


class ModelParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("threads", c_int32), ("kernels", c_char_p),
                ("memory_budget", c_uint64), ("mmap", c_int32), ("cache_policy", c_char_p),
                ("readers", c_int32), ("prefetch", c_int32), ("direct_io", c_int32),
                ("trunk", c_char_p), ("ctx", c_int64), ("sequences", c_int32),
                ("max_rows", c_int64), ("verbose", c_int32), ("heat_file", c_char_p),
                # appended: speculative decoding
                ("draft", c_char_p), ("draft_max", c_int32),
                # appended: the Vulkan GPU
                ("gpu", c_char_p),
                # appended: prefix snapshots of sequence states
                ("state_cache", c_char_p), ("state_cache_size", c_uint64),
                ("state_cache_ram", c_int64),
                # appended: homes on other drives
                ("homes", POINTER(c_char_p)), ("n_homes", c_size_t)]


class SamplingParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("max_new_tokens", c_int64),
                ("temperature", c_float), ("top_k", c_int32), ("top_p", c_float),
                ("min_p", c_float), ("repeat_penalty", c_float),
                ("presence_penalty", c_float), ("frequency_penalty", c_float),
                ("seed", c_uint64), ("has_seed", c_int32), ("stop", POINTER(c_char_p)),
                ("n_stop", c_size_t), ("prefill_chunk", c_int64), ("chat", c_int32)]


class TokenEvent(ctypes.Structure):
    _fields_ = [("id", c_int32), ("index", c_int64), ("text", c_void_p),
                ("text_len", c_size_t), ("reasoning", c_void_p), ("reasoning_len", c_size_t)]


TOKEN_CALLBACK = ctypes.CFUNCTYPE(c_int, POINTER(TokenEvent), c_void_p)


def _load() -> ctypes.CDLL:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("DELTAFIN_LIBRARY") or os.path.join(here, "libdeltafin.so")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"deltafin: cannot load the C library {path}: {e}. Reinstall the package with "
            "`make python` (it builds and bundles libdeltafin.so), or set DELTAFIN_LIBRARY to "
            "a built libdeltafin.so") from None
    P, PP = c_void_p, POINTER(c_void_p)
    sigs = {
        "deltafin_abi_version": (c_int, []),
        "deltafin_version": (c_char_p, []),
        "deltafin_last_error": (c_char_p, []),
        "deltafin_free": (None, [P]),
        "deltafin_model_params_init": (None, [POINTER(ModelParams)]),
        "deltafin_model_load": (c_int, [c_char_p, POINTER(ModelParams), PP]),
        "deltafin_model_free": (None, [P]),
        "deltafin_model_vocab": (c_int64, [P]),
        "deltafin_model_context": (c_int64, [P]),
        "deltafin_model_has_tokenizer": (c_int, [P]),
        "deltafin_model_has_vision": (c_int, [P]),
        "deltafin_model_info_json": (c_int, [P, PP]),
        "deltafin_model_memory_plan_json": (c_int, [P, PP]),
        "deltafin_model_stats_json": (c_int, [P, PP]),
        "deltafin_tokenize": (c_int, [P, c_char_p, c_size_t, c_int, PP, POINTER(c_size_t)]),
        "deltafin_detokenize": (c_int, [P, POINTER(c_int32), c_size_t, PP, POINTER(c_size_t)]),
        "deltafin_render_chat": (c_int, [P, c_char_p, PP, POINTER(c_size_t), PP]),
        "deltafin_session_new": (c_int, [P, PP]),
        "deltafin_session_free": (None, [P]),
        "deltafin_session_reset": (None, [P]),
        "deltafin_session_position": (c_int64, [P]),
        "deltafin_session_history": (c_int, [P, PP, POINTER(c_size_t)]),
        "deltafin_session_eval": (c_int, [P, POINTER(c_int32), c_size_t, c_int, P]),
        "deltafin_sampling_params_init": (None, [POINTER(SamplingParams)]),
        "deltafin_session_generate": (c_int, [P, POINTER(c_int32), c_size_t,
                                              POINTER(SamplingParams), TOKEN_CALLBACK, P, PP]),
        "deltafin_stream_start": (c_int, [P, c_char_p, c_int, PP]),
        "deltafin_stream_next": (c_int, [P, PP, POINTER(c_int)]),
        "deltafin_stream_response": (c_int, [P, PP]),
        "deltafin_stream_stats_json": (c_int, [P, PP]),
        "deltafin_stream_free": (None, [P]),
        "deltafin_chat_new": (c_int, [P, c_char_p, PP]),
        "deltafin_chat_free": (None, [P]),
        "deltafin_chat_reset": (None, [P]),
        "deltafin_chat_send": (c_int, [P, c_char_p, PP]),
        "deltafin_chat_history_json": (c_int, [P, PP]),
        "deltafin_chat_add_image": (c_int, [P, c_char_p, c_size_t, c_char_p]),
        "deltafin_chat_add_image_file": (c_int, [P, c_char_p]),
        "deltafin_chat_clear_images": (c_int, [P]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    if lib.deltafin_abi_version() != ABI_VERSION:
        raise ImportError(
            f"deltafin: {path} implements C ABI {lib.deltafin_abi_version()}, this package "
            f"needs {ABI_VERSION}; reinstall the package with the library it was built with")
    return lib


lib = _load()


def check(status: int) -> None:
    """Raises the Error subclass for a failed call, with the engine's message."""
    if status != 0:
        msg = lib.deltafin_last_error().decode("utf-8", "replace")
        raise _BY_STATUS.get(status, Error)(msg, status)


def take_bytes(ptr: c_void_p, size: int | None = None) -> bytes:
    """Copies and frees a buffer the library returned."""
    if not ptr.value:
        return b""
    try:
        return ctypes.string_at(ptr, size) if size is not None else ctypes.string_at(ptr)
    finally:
        lib.deltafin_free(ptr)


def take_ids(ptr: c_void_p, n: int) -> list[int]:
    if not ptr.value:
        return []
    try:
        return list(ctypes.cast(ptr, POINTER(c_int32))[:n])
    finally:
        lib.deltafin_free(ptr)


__all__ = ["lib", "check", "take_bytes", "take_ids", "byref", "Error", "ArgumentError",
           "ContextLengthError", "IoError", "ModelError", "OutOfMemoryError", "ModelParams",
           "SamplingParams", "TokenEvent", "TOKEN_CALLBACK"]
