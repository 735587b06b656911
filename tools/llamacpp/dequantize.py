#!/usr/bin/python3
"""Writes a float32 copy of a quantised DeepSeek-V3-layout checkpoint for llama.cpp's converter,
whose own dequantisation does not run on Debian 12's torch: FP8 needs torch.float8_e4m3fn, which
that torch lacks, and its INT4 unpacking mixes lazy and real tensors. A development tool of
tools/llamacpp-yardstick.sh; numpy only.

    dequantize.py MODEL_DIR OUT_DIR     writes the copy (OUT_DIR must not exist)
    dequantize.py --check QUANT_DIR     decodes the engine's dequantisation cases
                                        (tests/data/quant) and exits 1 unless every weight
                                        equals the reference's bit for bit (a ctest runs it)

- FP8 (Kimi K2, DeepSeek-V3 as released: E4M3 weights, `weight_scale_inv` 128 x 128 block
  scales): each weight becomes float32(e4m3) * scale, rounded once in float32.
- INT4 pack-quantized (K2-Thinking, K2.5: compressed-tensors `weight_packed` / `weight_scale` /
  `weight_shape`, symmetric, group 32): (nibble - 8) * scale, exact in float32.
Both are the values Deltafin's kernels multiply by (docs/FAMILY.md, "FP8 E4M3 weights" and
"INT4 pack-quantized weights"), so llama.cpp's float32 GGUF of the copy holds exactly the
weights Deltafin computes with. BF16 and F32 tensors are widened to F32; the scales are dropped
and config.json loses its quantization_config.
"""
import json
import os
import struct
import sys

import numpy as np

MAX_HEADER = 100 << 20


def e4m3_table():
    """float32 value of each E4M3 (fn) byte: bias 7, 3 mantissa bits, no infinities."""
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 7
        if exp == 0xF and man == 7:
            t[b] = np.nan
        elif exp == 0:
            t[b] = sign * man / 8.0 * 2.0 ** -6
        else:
            t[b] = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return t


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER:
            sys.exit(f"{path}: safetensors header of {n} bytes (at most {MAX_HEADER} expected)")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def load(path, base, info):
    begin, end = info["data_offsets"]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=base + begin, shape=(end - begin,))
    dtype, shape = info["dtype"], info["shape"]
    if dtype == "F8_E4M3":
        return TABLE[raw].reshape(shape)
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F32":
        return np.array(raw.view(np.float32).reshape(shape))
    if dtype in ("I32", "I64"):
        return raw.view(np.int32 if dtype == "I32" else np.int64).reshape(shape)
    sys.exit(f"{path}: tensor dtype {dtype} (expected F8_E4M3, BF16, F32, I32 or I64)")


def dequant_fp8(w, scale):
    """w: the codes' float32 values [R, C]; scale [ceil(R/128), ceil(C/128)] float32."""
    rows, cols = w.shape
    full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:rows, :cols]
    return (w * full).astype(np.float32)


def unpack_int4(packed, scale, shape):
    """W [R, C] = (nibble - 8) * scale[r, c // 32]; column 8j + i in bits 4i..4i+3 of word j."""
    rows, cols = (int(v) for v in shape)
    words = packed.astype(np.uint32)
    nibbles = (words[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    q = nibbles.reshape(rows, -1)[:, :cols].astype(np.float32) - 8.0
    return q * np.repeat(scale, 32, axis=1)[:, :cols]


def quant_kind(config):
    quant = config.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method == "fp8" and quant.get("weight_block_size") == [128, 128]:
        return "fp8"
    if method == "compressed-tensors" and quant.get("format") == "pack-quantized":
        groups = list((quant.get("config_groups") or {}).values())
        w = groups[0].get("weights", {}) if len(groups) == 1 else {}
        if (w.get("num_bits"), w.get("group_size"), w.get("symmetric"), w.get("type")) == (4, 32, True, "int"):
            return "int4"
    return None


def private(path):
    """A new file of ours alone (0600), never written through something already there."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb")


def check(quant_dir):
    """Every case of tests/data/quant decoded to the reference's float32 bits."""
    failures = 0
    for file, cases in (("fp8.safetensors", ("ragged", "special")),
                        ("int4.safetensors", ("expert", "ragged"))):
        path = os.path.join(quant_dir, file)
        header, base = read_header(path)
        for case in cases:
            want = load(path, base, header[case + ".expected"])
            if file.startswith("fp8"):
                got = dequant_fp8(load(path, base, header[case + ".weight"]),
                                  load(path, base, header[case + ".weight_scale_inv"]))
            else:
                got = unpack_int4(load(path, base, header[case + ".weight_packed"]),
                                  load(path, base, header[case + ".weight_scale"]),
                                  load(path, base, header[case + ".weight_shape"]))
            same = got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
            print(f"{file} {case}: {'bit-identical' if same else 'DIFFERENT'} {list(want.shape)}")
            failures += not same
    path = os.path.join(quant_dir, "fp8.safetensors")
    header, base = read_header(path)
    want = load(path, base, header["e4m3_values"])
    nan = np.isnan(want)
    same = np.array_equal(nan, np.isnan(TABLE)) and np.array_equal(
        TABLE[~nan].view(np.uint32), want[~nan].view(np.uint32))
    print(f"e4m3 table: {'bit-identical' if same else 'DIFFERENT'} (256 codes, {int(nan.sum())} NaN)")
    return failures + (not same)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        sys.exit(1 if check(sys.argv[2]) else 0)
    if len(sys.argv) != 3 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    model, out = sys.argv[1:]
    config = json.load(open(os.path.join(model, "config.json")))
    kind = quant_kind(config)
    if kind is None:
        sys.exit(f"{model}: neither FP8 with 128 x 128 block scales nor symmetric INT4 "
                 "pack-quantized with group 32")
    index_path = os.path.join(model, "model.safetensors.index.json")
    if os.path.exists(index_path):
        shards = sorted(set(json.load(open(index_path))["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        if os.path.basename(shard) != shard or not shard.endswith(".safetensors"):
            sys.exit(f"{model}: shard name {shard!r} (expected a file name ending .safetensors)")
    os.makedirs(out, mode=0o700, exist_ok=False)
    del config["quantization_config"]
    with private(os.path.join(out, "config.json")) as f:
        f.write(json.dumps(config, indent=2).encode())
    weight_map = {}
    for shard in shards:
        path = os.path.join(model, shard)
        header, base = read_header(path)
        # name in the copy -> (source tensor, the copy's shape)
        out_names = {}
        for n in sorted(header):
            if kind == "fp8" and not n.endswith("_scale_inv"):
                out_names[n] = (n, header[n]["shape"])
            elif kind == "int4" and n.endswith(".weight_packed"):
                stem = n.removesuffix("_packed")
                out_names[stem] = (n, [int(v) for v in load(path, base, header[stem + "_shape"])])
            elif kind == "int4" and not n.endswith((".weight_scale", ".weight_shape")):
                out_names[n] = (n, header[n]["shape"])
        names = sorted(out_names)
        layout, offset = {}, 0
        for name in names:
            shape = out_names[name][1]
            size = 4 * int(np.prod(shape, dtype=np.int64))
            layout[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(layout).encode()
        blob += b" " * (-len(blob) % 8)
        with private(os.path.join(out, shard)) as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for name in names:
                src, shape = out_names[name]
                w = load(path, base, header[src])
                if src.endswith(".weight_packed"):
                    w = unpack_int4(w, load(path, base, header[name + "_scale"]), shape)
                elif header[src]["dtype"] == "F8_E4M3":
                    w = dequant_fp8(w, load(path, base, header[name + "_scale_inv"]))
                f.write(np.ascontiguousarray(w, dtype=np.float32).tobytes())
                weight_map[name] = shard
        print(f"{shard}: {len(names)} tensors as float32", flush=True)
    with private(os.path.join(out, "model.safetensors.index.json")) as f:
        f.write(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2).encode())


TABLE = e4m3_table()

if __name__ == "__main__":
    main()
