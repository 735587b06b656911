# Writes tiny random checkpoints in the exact release layouts of the DeepSeek-V3 architecture
# as the Kimi K2 family and DeepSeek-V3 ship it (docs/FAMILY.md "## DeepSeek-V3 and Kimi K2",
# §Tiny checkpoints), for self-tests of tools/family/deepseek_v3_ref.py and for the engine's
# loader and kernels:
#   --variant k2           Kimi-K2-Instruct-0905: FP8 E4M3 linears, 128x128 block scales
#   --variant k2-int4      Kimi-K2-Thinking: BF16 trunk, routed experts INT4 pack-quantized
#   --variant k25          Kimi-K2.5: the K2-Thinking text model under language_model., nested
#                          text_config, rms_norm_eps 1e-5 (so the fixed 1e-6 latent norms differ)
#   --variant deepseek-v3  DeepSeek-V3: FP8, group-limited routing (n_group > 1), one MTP layer
#   --small                the engine's committed goldens (tests/data, each under 3 MB): hidden
#                          192, q_lora 160, dense intermediate 256, expert intermediate 64,
#                          vocabulary 256, deepseek-v3 with 3 layers (2 dense); blocks stay ragged
# Why it is built this way: the dimensions are chosen so every rule of the formats is hit at a
# size that runs in seconds: hidden 320 and q_lora 192 and kv_a's 160 rows and moe_inter 160
# give full AND ragged 128-blocks on both axes; every INT4 input width is a multiple of 32 and
# of 8; experts 5 and 6 of the first MoE layer share a router row and bias so top-k ties occur. Weights are
# drawn in float64, quantised here (nearest E4M3 code of W/scale with scale = amax/448 per
# block; symmetric int4 with a BF16 scale = amax/7.5 per 32) and the exact dequantised values are
# returned too, so a test can prove the reference's unpacking reproduces them bit for bit.
# The quantisers live here and the dequantisers in the reference: neither imports the other.
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

VARIANTS = ("k2", "k2-int4", "k25", "deepseek-v3")

# ---------------------------------------------------------------- quantisers


def _e4m3_positive():
    """Values of the E4M3FN codes 0x00..0x7E (all finite non-negative codes, increasing)."""
    vals = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        vals.append(m * 2.0 ** -9 if e == 0 else (8 + m) * 2.0 ** (e - 10))
    return np.array(vals)


E4M3_POS = _e4m3_positive()


def fp8_encode(x):
    """float64 array (|x| <= 448) -> nearest E4M3FN code, ties to the even code."""
    a = np.abs(x)
    if (a > 448).any():
        raise ValueError("value outside the E4M3 range")
    hi = np.clip(np.searchsorted(E4M3_POS, a), 1, len(E4M3_POS) - 1)
    lo = hi - 1
    dlo, dhi = a - E4M3_POS[lo], E4M3_POS[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def fp8_quantize(w, block=(128, 128)):
    """-> (codes u8 [R, C], scale_inv f32 [ceil(R/b0), ceil(C/b1)], dequantised float64)."""
    R, C = w.shape
    b0, b1 = block
    gr, gc = -(-R // b0), -(-C // b1)
    scale = np.ones((gr, gc), dtype=np.float32)
    codes = np.zeros((R, C), dtype=np.uint8)
    deq = np.zeros((R, C))
    for i in range(gr):
        for j in range(gc):
            blk = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1]
            amax = np.abs(blk).max()
            s = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
            while (np.abs(blk) / np.float64(s) > 448).any():  # float32 rounding of s went down
                s = np.nextafter(s, np.float32(np.inf))
            c = fp8_encode(blk / np.float64(s))
            scale[i, j] = s
            codes[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = c
            mag = E4M3_POS[c & 0x7F] * np.where(c & 0x80, -1.0, 1.0)
            deq[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = mag * np.float64(s)
    return codes, scale, deq


def pack_int4(q):
    """int q [R, C] in [-8, 7] -> int32 words [R, ceil(C/8)]: column 8j+i in bits 4i..4i+3 of
    word j, stored as q + 8; padding columns past C hold 0."""
    R, C = q.shape
    u = np.zeros((R, -(-C // 8) * 8), dtype=np.uint64)
    u[:, :C] = q + 8
    words = np.zeros((R, u.shape[1] // 8), dtype=np.uint64)
    for i in range(8):
        words |= u[:, i::8] << np.uint64(4 * i)
    return words.astype(np.uint32).view(np.int32)


def int4_quantize(w, group=32):
    """-> (packed i32 [R, ceil(C/8)], scale bf16 bits [R, C/group], shape i64 [2], dequantised).
    scale = bf16(amax / 7.5) per group, q = clamp(round(w / scale), -8, 7): the symmetric min-max
    rule, so both ends of the nibble range occur."""
    R, C = w.shape
    if C % group:
        raise ValueError(f"input width {C} is not a multiple of the group size {group}")
    g = w.reshape(R, C // group, group)
    amax = np.abs(g).max(-1)
    scale_bits = st.bf16_bits(np.where(amax > 0, amax / 7.5, 1.0))
    scale = st.bf16_value(scale_bits)
    q = np.clip(np.round(g / scale[..., None]), -8, 7).astype(np.int64).reshape(R, C)
    deq = (q.reshape(R, C // group, group) * scale[..., None]).reshape(R, C)
    return pack_int4(q), scale_bits, np.array([R, C], dtype=np.int64), deq


# ---------------------------------------------------------------- configs


SMALL = {"hidden_size": 192, "q_lora_rank": 160, "intermediate_size": 256, "moe_intermediate_size": 64, "vocab_size": 256}


def text_config(variant, small=False):
    """The release config.json fields (text model) at tiny sizes (FAMILY §Tiny checkpoints);
    small: the smaller sizes of the engine's committed goldens."""
    ds = variant == "deepseek-v3"
    c = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_deepseek.DeepseekV3Config",
            "AutoModel": "modeling_deepseek.DeepseekV3Model",
            "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
        },
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0 if ds else 1,
        "eos_token_id": 1 if ds else 2,
        "ep_size": 1,
        "first_k_dense_replace": 2 if ds else 1,
        "hidden_act": "silu",
        "hidden_size": 320,
        "initializer_range": 0.02,
        "intermediate_size": 384,
        "kv_lora_rank": 144,
        "max_position_embeddings": 163840 if ds else 262144,
        "model_type": "deepseek_v3" if ds else "kimi_k2",
        "moe_intermediate_size": 160,
        "moe_layer_freq": 1,
        "n_group": 4 if ds else 1,
        "n_routed_experts": 16,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 4 if ds else 3,
        "num_key_value_heads": 4,
        "num_nextn_predict_layers": 1 if ds else 0,
        "pretraining_tp": 1,
        "q_lora_rank": 192,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "rms_norm_eps": 1e-05 if variant == "k25" else 1e-06,
        "rope_scaling": {
            "beta_fast": 32 if ds else 1.0,
            "beta_slow": 1 if ds else 1.0,
            "factor": 40 if ds else 64.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000 if ds else 50000.0,
        "routed_scaling_factor": 2.5 if ds else 2.827,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": 2 if ds else 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.48.3",
        "use_cache": True,
        "v_head_dim": 32,
        "vocab_size": 512,
    }
    if variant in ("k2", "deepseek-v3"):
        c["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        }
    else:
        ignore = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
        if variant == "k25":
            ignore += ["re:.*vision_tower.*", "re:.*mm_projector.*"]
        c["quantization_config"] = {
            "config_groups": {
                "group_0": {
                    "input_activations": None,
                    "output_activations": None,
                    "targets": ["Linear"],
                    "weights": {
                        "actorder": None,
                        "block_structure": None,
                        "dynamic": False,
                        "group_size": 32,
                        "num_bits": 4,
                        "observer": "minmax",
                        "observer_kwargs": {},
                        "strategy": "group",
                        "symmetric": True,
                        "type": "int",
                    },
                }
            },
            "format": "pack-quantized",
            "ignore": ignore,
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
        }
    if small:
        c.update(SMALL)
        if ds:
            c["num_hidden_layers"] = 3
    return c


def full_config(variant, small=False):
    tc = text_config(variant, small)
    if variant != "k25":
        return tc
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {
            "AutoConfig": "configuration_kimi_k25.KimiK25Config",
            "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
        },
        "model_type": "kimi_k25",
        "dtype": "bfloat16",
        "ignore_index": -100,
        "media_placeholder_token_id": 5,
        "pad_token_id": 0,
        "bos_token_id": tc["bos_token_id"],
        "eos_token_id": tc["eos_token_id"],
        "tie_word_embeddings": False,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "text_config": tc,
        "vision_config": {"model_type": "kimi_k25_vision", "note": "vision tower not included in this checkpoint"},
        "transformers_version": "4.57.1",
    }


# ---------------------------------------------------------------- weights


class Builder:
    def __init__(self, variant, seed):
        self.variant = variant
        self.g = torch.Generator().manual_seed(seed)
        self.items = []  # (name, dtype, shape, bytes) in release order
        self.deq = {}  # name of the logical weight (without prefix) -> float64 values as stored
        self.prefix = "language_model." if variant == "k25" else ""

    def normal(self, shape, std):
        return (torch.randn(*shape, generator=self.g, dtype=torch.float64) * std).numpy()

    def add_raw(self, name, dtype, shape, raw):
        self.items.append((self.prefix + name, dtype, list(shape), raw.tobytes()))

    def bf16(self, name, x):
        bits = st.bf16_bits(x)
        self.add_raw(name, "BF16", x.shape, bits)
        self.deq[name] = st.bf16_value(bits)

    def f32(self, name, x):
        x = x.astype(np.float32)
        self.add_raw(name, "F32", x.shape, x)
        self.deq[name] = x.astype(np.float64)

    def linear(self, name, shape, gain, quant):
        """name ends in .weight; quant: None (BF16), 'fp8' or 'int4'."""
        w = self.normal(shape, gain / np.sqrt(shape[1]))
        if quant == "fp8":
            codes, scale, deq = fp8_quantize(w)
            self.add_raw(name, "F8_E4M3", shape, codes)
            self.add_raw(name + "_scale_inv", "F32", scale.shape, scale)
            self.deq[name] = deq
        elif quant == "int4":
            packed, scale_bits, shp, deq = int4_quantize(w)
            self.add_raw(name + "_packed", "I32", packed.shape, packed)
            self.add_raw(name + "_scale", "BF16", scale_bits.shape, scale_bits)
            self.add_raw(name + "_shape", "I64", shp.shape, shp)
            self.deq[name] = deq
        else:
            self.bf16(name, w)

    def norm(self, name, n):
        self.bf16(name, 1.0 + self.normal([n], 0.1))


def build(variant, seed=10, small=False):
    """-> (config dict, Builder with items and dequantised weights)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    tc = text_config(variant, small)
    b = Builder(variant, seed)
    fp8 = "fp8" if variant in ("k2", "deepseek-v3") else None
    experts_q = "int4" if variant in ("k2-int4", "k25") else fp8
    H, V = tc["hidden_size"], tc["vocab_size"]
    heads, nope, rope, vd = tc["num_attention_heads"], tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]
    ql, kl = tc["q_lora_rank"], tc["kv_lora_rank"]
    E, mi = tc["n_routed_experts"], tc["moe_intermediate_size"]
    L, nextn = tc["num_hidden_layers"], tc["num_nextn_predict_layers"]
    b.bf16("model.embed_tokens.weight", b.normal([V, H], 1.0))
    for i in range(L + nextn):
        p = f"model.layers.{i}."
        if i >= L:  # MTP layer: its own embedding copy, the two norms and the fusing projection
            b.bf16(p + "embed_tokens.weight", b.normal([V, H], 1.0))
            b.norm(p + "enorm.weight", H)
            b.norm(p + "hnorm.weight", H)
            b.linear(p + "eh_proj.weight", [H, 2 * H], 1.0, None)
        b.norm(p + "input_layernorm.weight", H)
        b.linear(p + "self_attn.q_a_proj.weight", [ql, H], 1.0, fp8)
        b.norm(p + "self_attn.q_a_layernorm.weight", ql)
        b.linear(p + "self_attn.q_b_proj.weight", [heads * (nope + rope), ql], 1.0, fp8)
        b.linear(p + "self_attn.kv_a_proj_with_mqa.weight", [kl + rope, H], 1.0, fp8)
        b.norm(p + "self_attn.kv_a_layernorm.weight", kl)
        b.linear(p + "self_attn.kv_b_proj.weight", [heads * (nope + vd), kl], 1.0, fp8)
        b.linear(p + "self_attn.o_proj.weight", [H, heads * vd], 0.5, fp8)
        b.norm(p + "post_attention_layernorm.weight", H)
        if i < tc["first_k_dense_replace"]:
            I = tc["intermediate_size"]
            b.linear(p + "mlp.gate_proj.weight", [I, H], 1.0, fp8)
            b.linear(p + "mlp.up_proj.weight", [I, H], 1.0, fp8)
            b.linear(p + "mlp.down_proj.weight", [H, I], 0.5, fp8)
        else:
            gate = b.normal([E, H], 1.0 / np.sqrt(H))
            bias = b.normal([E], 0.1)
            if i == tc["first_k_dense_replace"]:  # experts 5 and 6 (one group of 4) tie exactly
                gate[6], bias[6] = gate[5], bias[5]
            b.bf16(p + "mlp.gate.weight", gate)
            b.f32(p + "mlp.gate.e_score_correction_bias", bias)
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                b.linear(q + "gate_proj.weight", [mi, H], 1.0, experts_q)
                b.linear(q + "up_proj.weight", [mi, H], 1.0, experts_q)
                b.linear(q + "down_proj.weight", [H, mi], 0.5, experts_q)
            si = tc["n_shared_experts"] * mi
            b.linear(p + "mlp.shared_experts.gate_proj.weight", [si, H], 1.0, fp8)
            b.linear(p + "mlp.shared_experts.up_proj.weight", [si, H], 1.0, fp8)
            b.linear(p + "mlp.shared_experts.down_proj.weight", [H, si], 0.5, fp8)
        if i >= L:
            b.norm(p + "shared_head.norm.weight", H)
            b.bf16(p + "shared_head.head.weight", b.normal([V, H], 2.0 / np.sqrt(H)))
    b.norm("model.norm.weight", H)
    b.bf16("lm_head.weight", b.normal([V, H], 2.0 / np.sqrt(H)))
    return full_config(variant, small), b


def write(out_dir, variant, seed=10, shards=3, small=False):
    """Write config.json, the shards and model.safetensors.index.json; returns the Builder."""
    cfg, b = build(variant, seed, small)
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    total = sum(len(raw) for *_, raw in b.items)
    per = -(-total // shards)
    groups, cur, size = [], [], 0
    for it in b.items:  # contiguous runs in release order; a layer may straddle two shards
        if cur and size + len(it[3]) > per and len(groups) < shards - 1:
            groups.append(cur)
            cur, size = [], 0
        cur.append(it)
        size += len(it[3])
    groups.append(cur)
    n = len(groups)
    weight_map = {}
    for k, grp in enumerate(groups):
        shard = f"model-{k + 1:05d}-of-{n:06d}.safetensors"
        st.write_file(os.path.join(out_dir, shard), grp)
        for name, *_ in grp:
            weight_map[name] = shard

    def dump(name, obj):
        fd = os.open(os.path.join(out_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")

    dump("model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    dump("config.json", cfg)
    tc = cfg.get("text_config", cfg)
    dump("generation_config.json", {"bos_token_id": tc["bos_token_id"], "eos_token_id": tc["eos_token_id"]})
    return b


def main(argv=None):
    ap = argparse.ArgumentParser(description="tiny DeepSeek-V3 / Kimi K2 checkpoints in release layouts")
    ap.add_argument("--variant", required=True, choices=VARIANTS)
    ap.add_argument("--out", required=True, help="output folder (created 0700)")
    ap.add_argument("--seed", type=int, default=10, help="10: the golden prompt 3,1,4,1,5,9,2,6 then has greedy margins >= 0.037 in every variant")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="the smaller sizes of the engine's committed goldens")
    a = ap.parse_args(argv)
    b = write(a.out, a.variant, a.seed, a.shards, a.small)
    print(f"{a.variant}: {len(b.items)} tensors in {a.out}")


if __name__ == "__main__":
    main()
