#!/usr/bin/python3
# Writes a tiny random Kimi-Linear checkpoint in the exact release layout of
# moonshotai/Kimi-Linear-48B-A3B-* (docs/FAMILY.md, "Kimi-Linear"): config.json with every field
# the release's has (small dimensions), `model.`-prefixed tensors with the release's shapes
# rule and dtypes (BF16 everywhere, F32 for A_log and dt_bias), several safetensors shards named
# model-0000N-of-0000M.safetensors and model.safetensors.index.json. It is what the C++
# `make-model --preset kimi-linear` is to reproduce, and the model the float64 reference
# (kimi_linear_ref.py) self-checks on. Deterministic: numpy's PCG64 with a fixed seed, weights
# rounded to float32 and then to BF16 (nearest even), so the bytes are the same on every machine.
# The dimensions are chosen so that no two of the head counts and widths coincide where an
# implementation could confuse them (hidden 96, legacy head_dim 24, KDA 4 x 32 = 128, MLA
# nope 16 / rope 8 / v 24, experts 32 wide, dense 192), layer 0 is KDA + dense, MLA sits at
# 1-based 4 and 7 (the last layer, as in the release), and a few decay channels are so steep that
# exp(g) underflows float32 (Kimi-Linear's decay has no lower bound).
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kimi_linear_format as fmt  # noqa: E402

AUTO_MAP = {
    "AutoConfig": "configuration_kimi.KimiLinearConfig",
    "AutoModel": "modeling_kimi.KimiLinearModel",
    "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM",
}


def tiny_config(vocab):
    """The release config.json's exact field set (alphabetical, as the release writes it)."""
    layers, hidden, heads = 7, 96, 4
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "auto_map": AUTO_MAP,
        "bos_token_id": vocab - 256,  # the release's specials sit at [vocab-256, vocab)
        "dtype": "bfloat16",
        "eos_token_id": vocab - 254,
        "first_k_dense_replace": 1,
        "head_dim": hidden // heads,  # legacy field, read by nothing (release: 72)
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 192,
        "kv_lora_rank": 32,
        "linear_attn_config": {
            "full_attn_layers": [4, 7],
            "head_dim": 32,
            "kda_layers": [1, 2, 3, 5, 6],
            "num_heads": 4,
            "short_conv_kernel_size": 4,
        },
        "mla_use_nope": True,
        "model_max_length": 1048576,
        "model_type": "kimi_linear",
        "moe_intermediate_size": 32,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "num_attention_heads": heads,
        "num_expert_group": 1,
        "num_experts": 16,
        "num_experts_per_token": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": heads,
        "num_nextn_predict_layers": 0,
        "num_shared_experts": 1,
        "pad_token_id": vocab - 1,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "routed_scaling_factor": 2.446,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_grouped_topk": True,
        "v_head_dim": 24,
        "vocab_size": vocab,
    }


def generate(cfg, rng):
    """{name: float32 array} for every tensor of the inventory, in inventory order."""
    out = {}
    H = cfg.hidden
    for name, (shape, _) in fmt.expected_tensors(cfg).items():
        leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
        if name == "model.embed_tokens.weight":
            x = rng.normal(0.0, 1.0, shape)
        elif leaf in ("input_layernorm", "post_attention_layernorm", "norm", "o_norm", "kv_a_layernorm"):
            x = 1.0 + rng.normal(0.0, 0.1, shape)
        elif leaf == "A_log":
            # exp(A_log) per head: one very steep head (16), one below 1, the rest in between
            a = rng.uniform(0.5, 8.0, cfg.kda_heads)
            a[0], a[-1] = 16.0, 0.3
            x = np.log(a).reshape(shape)
        elif leaf == "dt_bias":
            x = rng.normal(0.0, 1.5, shape)
            hot = rng.choice(shape[0], size=max(2, shape[0] // 16), replace=False)
            x[hot] = rng.uniform(8.0, 14.0, hot.size)  # softplus ~ 8..14: exp(g) far below 1e-38 on steep heads
            cold = rng.choice(shape[0], size=max(2, shape[0] // 16), replace=False)
            x[cold] = rng.uniform(-9.0, -6.0, cold.size)  # decay ~ 1: long memory
        elif leaf in ("q_conv1d", "k_conv1d", "v_conv1d"):
            x = rng.normal(0.0, 0.5, shape)
        elif leaf == "e_score_correction_bias":
            x = rng.normal(0.0, 0.1, shape)
        elif leaf in ("o_proj", "down_proj", "w2"):
            x = rng.normal(0.0, 0.5 / np.sqrt(shape[1]), shape)
        else:  # every other linear: unit-scale outputs
            x = rng.normal(0.0, 1.0 / np.sqrt(shape[-1]), shape)
        out[name] = x.astype(np.float32)
    assert set(out) == set(fmt.expected_tensors(cfg))
    return out


def shard_of(name, layers, shards):
    """Embedding with the first layers, final norm and head with the last (as the release)."""
    if name == "model.embed_tokens.weight":
        return 0
    if name in ("model.norm.weight", "lm_head.weight"):
        return shards - 1
    layer = int(name.split(".")[2])
    return min(shards - 1, layer * shards // layers)


def write(out_dir, vocab, seed, shards):
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SystemExit(f"{out_dir}: exists and is not empty; give a new folder (nothing is overwritten)")
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    raw_cfg = tiny_config(vocab)
    cfg = fmt.KLConfig(raw_cfg)
    inv = fmt.expected_tensors(cfg)
    values = generate(cfg, np.random.default_rng(seed))
    names = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    files = [[] for _ in range(shards)]
    weight_map, total = {}, 0
    for name, (shape, dt) in inv.items():
        x = values[name]
        raw = fmt.f64_to_bf16_bits(x).astype("<u2").tobytes() if dt == "BF16" else x.astype("<f4").tobytes()
        k = shard_of(name, cfg.layers, shards)
        files[k].append((name, dt, shape, raw))
        weight_map[name] = names[k]
        total += len(raw)
    for k in range(shards):  # safetensors' own order: wider dtypes first, then by name
        files[k].sort(key=lambda it: (-fmt.DTYPE_SIZE[it[1]], it[0]))
        fmt.write_safetensors(os.path.join(out_dir, names[k]), files[k])
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    for fname, obj in (("config.json", raw_cfg), ("model.safetensors.index.json", index)):
        fd = os.open(os.path.join(out_dir, fname), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    print(f"wrote {out_dir}: {len(inv)} tensors, {fmt.parameter_count(cfg)} parameters, {total} bytes in {shards} shards")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a tiny random Kimi-Linear checkpoint in the release layout")
    ap.add_argument("--out", required=True, help="new (or empty) folder to write")
    ap.add_argument("--vocab", type=int, default=512, help="vocabulary size (>= 512; the last 256 ids are the special block)")
    ap.add_argument("--seed", type=int, default=20251030)
    ap.add_argument("--shards", type=int, default=3)
    a = ap.parse_args(argv)
    if not 512 <= a.vocab <= 1 << 20:
        raise SystemExit("--vocab must be in 512..1048576")
    if not 1 <= a.shards <= 7:
        raise SystemExit("--shards must be in 1..7 (the tiny model has 7 layers)")
    write(a.out, a.vocab, a.seed, a.shards)
    return 0


if __name__ == "__main__":
    sys.exit(main())
