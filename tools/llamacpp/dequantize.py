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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "family"))
import safetensors_io as st  # noqa: E402  (the family tools' checked reader)


def e4m3_table():
    """float32 value of each E4M3FN code: (8 + m) 2^(e-10), subnormal m 2^-9, 0x7F/0xFF NaN."""
    c = np.arange(256)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2(e - 10.0))
    v = np.where(c & 0x80, -v, v).astype(np.float32)
    v[(e == 15) & (m == 7)] = np.nan
    return v


def value(t):
    """A stored tensor's values: float32 for F8_E4M3 codes, BF16 and F32; integers as stored."""
    if t.dtype == "F8_E4M3":
        return TABLE[t.raw]
    if t.dtype == "BF16":
        return (t.raw.astype(np.uint32) << 16).view(np.float32)
    if t.dtype == "F32":
        return np.asarray(t.raw, dtype=np.float32)
    if t.dtype in ("I32", "I64"):
        return t.raw
    raise ValueError(f"tensor dtype {t.dtype} (expected F8_E4M3, BF16, F32, I32 or I64)")


def dequant_fp8(w, scale):
    """w: the codes' float32 values [R, C]; scale [ceil(R/128), ceil(C/128)] float32."""
    rows, cols = w.shape
    if scale.shape != (-(-rows // 128), -(-cols // 128)):
        raise ValueError(f"block scales {list(scale.shape)} for a [{rows}, {cols}] weight")
    full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:rows, :cols]
    return (w * full).astype(np.float32)


def unpack_int4(packed, scale, shape):
    """W [R, C] = (nibble - 8) * scale[r, c // 32]; column 8j + i in bits 4i..4i+3 of word j."""
    rows, cols = (int(v) for v in shape)
    if packed.shape != (rows, -(-cols // 8)) or scale.shape != (rows, -(-cols // 32)):
        raise ValueError(f"weight_shape [{rows}, {cols}] with packed words {list(packed.shape)} "
                         f"and scales {list(scale.shape)}")
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
        t = st.read_file(os.path.join(quant_dir, file))
        for case in cases:
            want = value(t[case + ".expected"])
            if file.startswith("fp8"):
                got = dequant_fp8(value(t[case + ".weight"]), value(t[case + ".weight_scale_inv"]))
            else:
                got = unpack_int4(value(t[case + ".weight_packed"]), value(t[case + ".weight_scale"]),
                                  value(t[case + ".weight_shape"]))
            same = got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
            print(f"{file} {case}: {'bit-identical' if same else 'DIFFERENT'} {list(want.shape)}")
            failures += not same
    want = value(st.read_file(os.path.join(quant_dir, "fp8.safetensors"))["e4m3_values"])
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
        t = st.read_file(os.path.join(model, shard))
        # name in the copy -> (source tensor, the copy's shape)
        out_names = {}
        for n in sorted(t):
            if kind == "fp8" and not n.endswith("_scale_inv"):
                out_names[n] = (n, list(t[n].shape))
            elif kind == "int4" and n.endswith(".weight_packed"):
                stem = n.removesuffix("_packed")
                out_names[stem] = (n, [int(v) for v in value(t[stem + "_shape"])])
            elif kind == "int4" and not n.endswith((".weight_scale", ".weight_shape")):
                out_names[n] = (n, list(t[n].shape))
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
                w = value(t[src])
                if src.endswith(".weight_packed"):
                    w = unpack_int4(w, value(t[name + "_scale"]), shape)
                elif t[src].dtype == "F8_E4M3":
                    w = dequant_fp8(w, value(t[name + "_scale_inv"]))
                f.write(np.ascontiguousarray(w, dtype=np.float32).tobytes())
                weight_map[name] = shard
        print(f"{shard}: {len(names)} tensors as float32", flush=True)
    with private(os.path.join(out, "model.safetensors.index.json")) as f:
        f.write(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2).encode())


TABLE = e4m3_table()

if __name__ == "__main__":
    try:
        main()
    except (ValueError, KeyError, OSError) as e:  # a malformed checkpoint: say what, not a trace
        sys.exit(f"dequantize.py: {e}")
