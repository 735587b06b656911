# A small safetensors reader and writer for the Kimi-family development tools (Debian has no
# safetensors package, and tools/train/k3.py's reader knows only BF16/F32/U8). It returns raw
# numpy arrays of the stored integer or float type and leaves every decoding of quantised
# formats (F8_E4M3 codes, packed INT4 words) to its caller, so the reference and the checkpoint
# generator each do their own half of a quantisation round trip. Headers are checked (offsets
# inside the file, sizes matching dtype x shape, no overlaps) because a reference that silently
# reads a truncated shard produces plausible but wrong goldens.
import json
import os
import struct

import numpy as np

# safetensors dtype string -> (numpy dtype of the raw storage, bytes per element)
DTYPES = {
    "BF16": (np.uint16, 2),
    "F16": (np.float16, 2),
    "F32": (np.float32, 4),
    "F64": (np.float64, 8),
    "F8_E4M3": (np.uint8, 1),
    "U8": (np.uint8, 1),
    "I8": (np.int8, 1),
    "I32": (np.int32, 4),
    "I64": (np.int64, 8),
}

MAX_HEADER = 100 * 1024 * 1024


class Tensor:
    """A stored tensor: safetensors dtype string, shape, raw little-endian storage array."""

    def __init__(self, dtype, shape, raw):
        self.dtype = dtype
        self.shape = tuple(shape)
        self.raw = raw

    def __repr__(self):
        return f"Tensor({self.dtype}, {list(self.shape)})"


def read_file(path):
    """name -> Tensor for one .safetensors file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: shorter than the 8-byte header length")
        n = struct.unpack("<Q", head)[0]
        if n > MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: header length {n} does not fit a file of {size} bytes")
        header = json.loads(f.read(n))
        data = f.read()
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    out = {}
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dt = meta.get("dtype")
        if dt not in DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt!r}")
        shape = meta.get("shape")
        a, b = meta.get("data_offsets", [None, None])
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"{path}: tensor {name} has a malformed shape {shape!r}")
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a <= b <= len(data)):
            raise ValueError(f"{path}: tensor {name} has offsets {a}..{b} outside {len(data)} data bytes")
        np_dt, width = DTYPES[dt]
        count = int(np.prod(shape)) if shape else 1
        if b - a != count * width:
            raise ValueError(f"{path}: tensor {name} holds {b - a} bytes, {dt}{shape} needs {count * width}")
        raw = np.frombuffer(data[a:b], dtype=np.dtype(np_dt).newbyteorder("<")).reshape(shape)
        out[name] = Tensor(dt, shape, raw)
        spans.append((a, b, name))
    spans.sort()
    for (a0, b0, n0), (a1, b1, n1) in zip(spans, spans[1:]):
        if a1 < b0:
            raise ValueError(f"{path}: tensors {n0} and {n1} overlap")
    return out


def read_checkpoint(model_dir):
    """name -> Tensor over every shard named by model.safetensors.index.json (or one
    model.safetensors). Every name in the index must be in the shard it names, and no shard may
    hold a tensor the index does not list."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        single = os.path.join(model_dir, "model.safetensors")
        if os.path.exists(single):
            return read_file(single)
        raise FileNotFoundError(f"{model_dir}: neither model.safetensors.index.json nor model.safetensors")
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        if os.path.basename(shard) != shard:
            raise ValueError(f"{index_path}: shard name {shard!r} is not a plain file name")
        got = read_file(os.path.join(model_dir, shard))
        for name in got:
            if weight_map.get(name) != shard:
                raise ValueError(f"{shard}: tensor {name} is not listed for this shard in the index")
        tensors.update(got)
    missing = sorted(n for n in weight_map if n not in tensors)
    if missing:
        raise ValueError(f"{index_path}: tensors listed but absent from their shards: {missing[:5]}")
    return tensors


def write_file(path, items):
    """items: list of (name, dtype string, shape, bytes), written in order, 8-byte aligned header."""
    header, offset = {}, 0
    for name, dt, shape, raw in items:
        np_dt, width = DTYPES[dt]
        count = int(np.prod(shape)) if len(shape) else 1
        if len(raw) != count * width:
            raise ValueError(f"{name}: {len(raw)} bytes for {dt}{list(shape)}")
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, raw in items:
            f.write(raw)
    return offset


def bf16_bits(x):
    """float64/float32 array -> uint16 BF16 bit patterns, round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    """uint16 BF16 bit patterns -> float64 values (exact)."""
    return np.ascontiguousarray(np.asarray(bits, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
