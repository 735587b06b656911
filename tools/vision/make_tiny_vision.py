#!/usr/bin/python3
# Writes a small random Kimi K3 vision tower + projector in the release layout (docs/VISION.md
# §4.1, §7): the release tensor names, BF16 like the release, the real vision_config field names
# with small values, the release media_proc_cfg, safetensors shards + model.safetensors.index.json.
# It exists so the float64 reference (k3_vision_ref.py) and, later, the engine can be tested
# before anyone downloads the 401 M-parameter tower; the C++ `make-model` is to build the same
# structure from the same §7 table, so keep the two in step.
#
# Why it is built this way: every dimension that differs in the release is kept different here
# (qkv_hidden_size != vt_hidden_size, head_dim a multiple of 4 but not hidden/heads, intermediate
# != hidden), so a layout mistake cannot cancel out; weights are scaled so activations stay O(1)
# through both layers and the norm weights sit near 1 with visible spread; the position-embedding
# grid is the release's 64x64, so every non-64x64 image exercises the interpolation. Seeded: the
# same arguments always give the same bytes.
#
# Usage: make_tiny_vision.py OUT_DIR [--seed N] [--hidden 64] [--heads 2] [--qkv 96] [--inter 128]
#        [--layers 2] [--text-hidden 256] [--pos 64]
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_vision_pre as pre  # noqa: E402
import k3_vision_ref as ref  # noqa: E402


def bf16_bytes(t):
    """Round-to-nearest-even float -> BF16, little-endian bytes."""
    u = t.detach().to(torch.float32).contiguous().numpy().view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")).tobytes()


def write_safetensors(path, items):
    header, off = {}, 0
    for name, shape, raw in items:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for _, _, raw in items:
            f.write(raw)


def make(out_dir, seed=1234, hidden=64, heads=2, qkv=96, inter=128, layers=2, text_hidden=256, pos=64):
    vision_config = {
        "activation_func": "gelu_pytorch_tanh", "attn_bias": False, "init_pos_emb_height": pos,
        "init_pos_emb_time": 4, "init_pos_emb_width": pos, "linear_bias": False,
        "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool", "mlp_type": "mlp2",
        "mm_hidden_size": hidden, "mm_projector_type": "patchmergerv2", "norm_type": "rmsnorm",
        "patch_embed_proj_bias": False, "patch_size": 14, "pos_emb_interpolation_mode": "bilinear",
        "pos_emb_type": "divided_fixed", "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05,
        "qkv_hidden_size": qkv, "text_hidden_size": text_hidden, "vt_hidden_size": hidden,
        "vt_intermediate_size": inter, "vt_num_attention_heads": heads, "vt_num_hidden_layers": layers,
    }
    cfg = ref.VisionConfig(vision_config)
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    tensors = {}
    for name, shape in cfg.expected_tensors().items():
        if name.endswith(("norm0.weight", "norm1.weight", "final_layernorm.weight", "post_norm.weight")):
            t = 1.0 + 0.2 * randn(*shape)
        elif name.endswith("pos_emb.weight"):
            t = 0.5 * randn(*shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            t = randn(*shape) / np.sqrt(fan_in)
        tensors[name] = t
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    # Release layout: projector and tower in the last two shards (95 and 96 of 96 in the release).
    shards = {"model-00001-of-000002.safetensors": sorted(n for n in tensors if n.startswith("mm_projector.")),
              "model-00002-of-000002.safetensors": sorted(n for n in tensors if n.startswith("vision_tower."))}
    weight_map = {}
    for shard, names in shards.items():
        write_safetensors(os.path.join(out_dir, shard), [(n, tensors[n].shape, bf16_bytes(tensors[n])) for n in names])
        weight_map.update({n: shard for n in names})
    total = sum(2 * int(np.prod(t.shape)) for t in tensors.values())

    def wjson(name, obj):
        fd = os.open(os.path.join(out_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")

    wjson("model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    wjson("config.json", {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "media_placeholder_token_id": 163605, "image_placeholder": "<|kimi_image_placeholder|>",
        "ignore_index": -100, "pad_token_id": 163839, "bos_token_id": 163584, "eos_token_id": 163586,
        "dtype": "bfloat16", "tie_word_embeddings": False,
        "note": "tiny random vision tower + projector only (tools/vision/make_tiny_vision.py); no text model",
        "vision_config": vision_config,
    })
    wjson("preprocessor_config.json", {"media_proc_cfg": pre.RELEASE_MEDIA_PROC_CFG})
    return len(tensors), total


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--qkv", type=int, default=96)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--text-hidden", type=int, default=256)
    ap.add_argument("--pos", type=int, default=64)
    a = ap.parse_args()
    n, total = make(a.out_dir, a.seed, a.hidden, a.heads, a.qkv, a.inter, a.layers, a.text_hidden, a.pos)
    print(f"{a.out_dir}: {n} tensors, {total} bytes of BF16")


if __name__ == "__main__":
    main()
