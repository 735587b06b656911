# Writes the small FP8 and INT4 weight files the engine's dequantisation tests compare against
# (tests/data/quant/, see its README): quantised tensors exactly as the Kimi K2 / DeepSeek-V3
# releases store them, next to the float32 weights the float64 reference decodes them to.
#
# Why it is built this way: the C++ tests cannot run Python, so the reference's answers are
# written once into the repository. The codes come from make_tiny_deepseek_v3.py's quantisers
# (the same ones the tiny checkpoints use) and the expected weights from deepseek_v3_ref.py's
# dequantisers (exact in float64), so the files check the engine against the reference, not
# against itself. The engine rounds an FP8 code times its F32 scale once to float32, so the
# expected value is float32(reference); INT4 products are exact in float32 either way. Each
# tensor is chosen to hit a rule of docs/FAMILY.md: ragged 128-blocks on both axes, every
# finite E4M3 code (subnormals, +-0, +-448), subnormal / huge / negative scales, the nibble
# extremes q = -8 and 7, an input width that is not a multiple of 8 or 32 (padding nibbles) and
# an I32 `weight_shape`. NaN codes are not here: the reference refuses them (the engine's own
# test checks that they decode to NaN, against the table written here).
# Debian python3-numpy and python3-torch only (the two modules it imports need them).
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_v3_ref as ref  # noqa: E402
import make_tiny_deepseek_v3 as tiny  # noqa: E402
import safetensors_io as st  # noqa: E402


def f32(x):
    """float64 -> float32, rounded once to nearest even (numpy's conversion)."""
    with np.errstate(over="raise"):
        return np.asarray(x, dtype=np.float64).astype(np.float32)


def fp8_tensors(name, codes, scale):
    """The stored pair and the reference's decoding of it."""
    R, C = codes.shape
    w = st.Tensor("F8_E4M3", (R, C), codes)
    s = st.Tensor("F32", scale.shape, scale.astype(np.float32))
    deq = ref.dequant_fp8(name + ".weight", w, s, (128, 128))
    return [
        (name + ".weight", "F8_E4M3", [R, C], codes.astype(np.uint8).tobytes()),
        (name + ".weight_scale_inv", "F32", list(scale.shape), scale.astype(np.float32).tobytes()),
        (name + ".expected", "F32", [R, C], f32(deq).tobytes()),
    ]


def int4_tensors(name, q, scale_bits, shape_dtype):
    """q int [R, C] in [-8, 7], BF16 scale bits [R, ceil(C/32)] -> stored triple + decoding."""
    R, C = q.shape
    packed = tiny.pack_int4(q)
    shape = np.array([R, C], dtype=np.int64 if shape_dtype == "I64" else np.int32)
    deq = ref.dequant_int4(
        name + ".weight",
        st.Tensor("I32", packed.shape, packed),
        st.Tensor("BF16", scale_bits.shape, scale_bits),
        st.Tensor(shape_dtype, (2,), shape),
        32,
    )
    return [
        (name + ".weight_packed", "I32", list(packed.shape), packed.tobytes()),
        (name + ".weight_scale", "BF16", list(scale_bits.shape), scale_bits.astype(np.uint16).tobytes()),
        (name + ".weight_shape", shape_dtype, [2], shape.tobytes()),
        (name + ".expected", "F32", [R, C], f32(deq).tobytes()),
    ]


def build(seed):
    rng = np.random.RandomState(seed)
    fp8 = []
    # Ragged on both axes ([130, 260] -> scales [2, 3]; last blocks 2 rows, 4 columns), quantised
    # as the tiny checkpoints are (scale = amax / 448 per block, nearest code).
    codes, scale, _ = tiny.fp8_quantize(rng.normal(0.0, 0.05, (130, 260)))
    fp8 += fp8_tensors("ragged", codes, scale)
    # Every finite code, in every position pattern, under unusual scales: a float32 subnormal
    # (results rounded into the subnormal range), a huge one (448 x it is still finite), a
    # negative one, and (last block column, 44 wide) an ordinary one.
    R, C = 40, 300
    codes = ((np.arange(R)[:, None] * 37 + np.arange(C)[None, :] * 3) % 256).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] ^= 0x01  # NaN codes -> +-448
    codes[0, :8] = [0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7E, 0xFE]
    scale = np.array([[np.float32(3e-40), np.float32(7.5e35), np.float32(-0.3183099)]], dtype=np.float32)
    fp8 += fp8_tensors("special", codes, scale)
    # All 256 codes, NaN included, as the reference's table has them.
    fp8.append(("e4m3_values", "F32", [256], f32(ref.E4M3).tobytes()))

    int4 = []
    # An expert-shaped matrix through the tiny checkpoints' quantiser (symmetric min-max: q = -8
    # and 7 both occur), weight_shape I64 as the releases write it.
    packed, scale_bits, _, _ = tiny.int4_quantize(rng.normal(0.0, 0.05, (64, 256)))
    words = packed.view(np.uint32).astype(np.int64)
    q = np.stack([(words >> (4 * i)) & 0xF for i in range(8)], axis=-1).reshape(64, -1) - 8
    int4 += int4_tensors("expert", q, scale_bits, "I64")
    # 100 columns (13 words, the last half padding; 4 groups, the last 4 wide), I32 shape,
    # scales: BF16 subnormal, 2^123 (x 8 still finite), negative, zero, and ordinary ones.
    R, C = 33, 100
    q = rng.randint(-8, 8, size=(R, C))
    q[0, :16] = np.arange(-8, 8)
    sc = np.abs(rng.normal(0.0, 0.01, (R, 4))) + 1e-4
    scale_bits = st.bf16_bits(sc)
    scale_bits[0, :4] = [0x0001, 0x7D00, 0xBF80, 0x0000]
    scale_bits[1, 3] = 0x8000  # -0
    int4 += int4_tensors("ragged", q, scale_bits, "I32")
    return fp8, int4


def main(argv=None):
    ap = argparse.ArgumentParser(description="FP8 / INT4 dequantisation cases for the engine's tests")
    ap.add_argument("--out", required=True, help="output folder (tests/data/quant)")
    ap.add_argument("--seed", type=int, default=36)
    a = ap.parse_args(argv)
    os.makedirs(a.out, mode=0o700, exist_ok=True)
    fp8, int4 = build(a.seed)
    for file, items in (("fp8.safetensors", fp8), ("int4.safetensors", int4)):
        n = st.write_file(os.path.join(a.out, file), items)
        back = st.read_file(os.path.join(a.out, file))  # the reader's checks on what was written
        print(f"{file}: {len(back)} tensors, {n} data bytes")


if __name__ == "__main__":
    main()
