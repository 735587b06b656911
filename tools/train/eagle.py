# An independent PyTorch EAGLE-3.1 drafter for a K3 target, written from
# docs/DRAFT-MODELS.md §3 and sharing no code with the engine (src/draft/): it trains the
# demo model's drafter and, as a second implementation, cross-checks `deltafin propose` on the
# exported folder. Parameters are keyed by the release tensor names, and export writes the released
# folder layout (config.json with the release's field names + one model.safetensors, BF16); K3's
# embedding table is not stored (the engine uses the target's, as for the released drafters).
#
# One module serves training and inference because the training forward *is* the inference chain
# unrolled: depth 1 is the row built from the target's real taps, (g_p, x_{p+1}) at RoPE position
# p; depth k reuses depth k-1's output hidden of the previous position and attends to the real rows
# up to the chain's start plus the chain rows before it ("training-time test", the EAGLE-3 mask).
import json
import math
import os

import numpy as np
import torch

import k3


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


class DraftConfig:
    """The fields of the released config.json this drafter uses (docs/DRAFT-MODELS.md §3.1)."""

    def __init__(self, j):
        self.j = j
        self.hidden = j["hidden_size"]
        self.inter = j["intermediate_size"]
        self.heads = j["num_attention_heads"]
        self.q_lora = j["q_lora_rank"]
        self.kv_lora = j["kv_lora_rank"]
        self.nope = j["qk_nope_head_dim"]
        self.rope = j["qk_rope_head_dim"]
        self.vdim = j["v_head_dim"]
        self.vocab = j["vocab_size"]
        self.eps = j["rms_norm_eps"]
        self.taps = j["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        self.fc_norm = bool(j.get("fc_norm", False))
        self.norm_output = bool(j.get("norm_output", False))
        y = j["rope_scaling"]
        self.theta = j["rope_theta"]
        self.factor = y["factor"]
        self.orig = y["original_max_position_embeddings"]
        self.beta_fast, self.beta_slow = y["beta_fast"], y["beta_slow"]
        self.mscale, self.mscale_all = y["mscale"], y["mscale_all_dim"]


def config_json(target_tc, taps, inter=None):
    """A config.json for an EAGLE-3.1 drafter of `target_tc` (a K3 text_config), with the released
    checkpoint's field names and values (YaRN θ 50000 × 32, mla_use_nope as released)."""
    H = target_tc["hidden_size"]
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
        "hidden_size": H, "intermediate_size": inter or 2 * H, "num_hidden_layers": 1,
        "num_attention_heads": target_tc["num_attention_heads"],
        "num_key_value_heads": target_tc["num_attention_heads"],
        "q_lora_rank": target_tc["q_lora_rank"], "kv_lora_rank": target_tc["kv_lora_rank"],
        "qk_nope_head_dim": target_tc["qk_nope_head_dim"], "qk_rope_head_dim": target_tc["qk_rope_head_dim"],
        "v_head_dim": target_tc["v_head_dim"], "mla_use_nope": True, "rms_norm_eps": 1e-5,
        "vocab_size": target_tc["vocab_size"], "draft_vocab_size": target_tc["vocab_size"],
        "torch_dtype": "bfloat16", "rope_theta": 50000.0,
        "max_position_embeddings": target_tc["max_position_embeddings"], "hidden_act": "silu",
        "rope_scaling": {"factor": 32.0, "original_max_position_embeddings": 32768, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "type": "yarn"},
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(taps), "use_aux_hidden_state": True,
                         "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                         "use_mtp_layernorm": False},
        "fc_norm": True, "norm_output": True,
    }


def shapes(c):
    H, n = c.hidden, len(c.taps)
    L = "layers.0."
    a = L + "self_attn."
    s = {"fc.weight": (H, n * H)}
    for i in range(n):
        s[f"fc_norm.{i}.weight"] = (H,)
    s.update({
        L + "hidden_norm.weight": (H,), L + "input_layernorm.weight": (H,),
        L + "post_attention_layernorm.weight": (H,),
        a + "q_a_proj.weight": (c.q_lora, 2 * H), a + "q_a_layernorm.weight": (c.q_lora,),
        a + "q_b_proj.weight": (c.heads * (c.nope + c.rope), c.q_lora),
        a + "kv_a_proj_with_mqa.weight": (c.kv_lora + c.rope, 2 * H), a + "kv_a_layernorm.weight": (c.kv_lora,),
        a + "kv_b_proj.weight": (c.heads * (c.nope + c.vdim), c.kv_lora),
        a + "o_proj.weight": (H, c.heads * c.vdim),
        L + "mlp.gate_proj.weight": (c.inter, H), L + "mlp.up_proj.weight": (c.inter, H),
        L + "mlp.down_proj.weight": (H, c.inter),
        "norm.weight": (H,), "lm_head.weight": (c.vocab, H),
    })
    return s


def init_params(c, gen, target=None):
    """Norms at one, projections small, the residual branches' output projections (o_proj,
    down_proj) at zero and fc passing the last tap through, so the untrained drafter is the
    target's own head read on its deepest tap (a "logit lens"), a sane start; the head and final
    norm start from the target's (the draft predicts the same distribution from a normed hidden
    of the same width)."""
    P = {}
    for name, shp in shapes(c).items():
        if len(shp) == 1:
            P[name] = torch.ones(shp)
        else:
            P[name] = torch.randn(shp, generator=gen) * (1.0 / math.sqrt(shp[1]))
    H, n = c.hidden, len(c.taps)
    P["fc.weight"] = P["fc.weight"] * 0.1
    P["fc.weight"][:, (n - 1) * H :] += torch.eye(H)
    P["layers.0.self_attn.o_proj.weight"].zero_()
    P["layers.0.mlp.down_proj.weight"].zero_()
    if target is not None:
        P["lm_head.weight"] = target.w("lm_head.weight").detach().float().clone()
        P["norm.weight"] = target.w("model.norm.weight").detach().float().clone()
    return P


class Eagle31(torch.nn.Module):
    def __init__(self, cfg, params):
        super().__init__()
        self.c = cfg
        self.p = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(t) for n, t in params.items()})
        inv, self.cos_scale, self.score_scale = yarn(cfg)
        self.register_buffer("inv_freq", inv, persistent=False)

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def names(self):
        return [n.replace("__", ".") for n in self.p.keys()]

    # -- pieces (docs/DRAFT-MODELS.md §3.3, §5)

    def fuse(self, taps):
        """taps [..., n, H] -> g [..., H]: RMSNorm per tap (fc_norm), concatenated, fc."""
        c = self.c
        if c.fc_norm:
            taps = torch.stack([rms(taps[..., i, :], self.w(f"fc_norm.{i}.weight"), c.eps)
                                for i in range(taps.shape[-2])], dim=-2)
        return taps.flatten(-2) @ self.w("fc.weight").T

    def layer_input(self, emb, h):
        L = "layers.0."
        return torch.cat([rms(emb, self.w(L + "input_layernorm.weight"), self.c.eps),
                          rms(h, self.w(L + "hidden_norm.weight"), self.c.eps)], dim=-1)

    def rotate(self, x, pos, heads=False):
        """Adjacent pairs (2i, 2i+1) rotated by frequency i at `pos` ([R] or a scalar); `heads`:
        x has a heads axis before the rope one."""
        ang = pos.to(torch.float64).unsqueeze(-1) * self.inv_freq  # [..., rope/2]
        cs = (torch.cos(ang) * self.cos_scale).to(x.dtype)
        sn = (torch.sin(ang) * self.cos_scale).to(x.dtype)
        if heads:
            cs, sn = cs.unsqueeze(-2), sn.unsqueeze(-2)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cs - x1 * sn, x0 * sn + x1 * cs], dim=-1).flatten(-2)

    def keys(self, u, pos):
        """Per row: k_nope [.., heads, nope], k_pe [.., rope], v [.., heads, vdim]."""
        c, a = self.c, "layers.0.self_attn."
        kv = u @ self.w(a + "kv_a_proj_with_mqa.weight").T
        lat = rms(kv[..., : c.kv_lora], self.w(a + "kv_a_layernorm.weight"), c.eps)
        kpe = self.rotate(kv[..., c.kv_lora :], pos)
        kvb = (lat @ self.w(a + "kv_b_proj.weight").T).unflatten(-1, (c.heads, c.nope + c.vdim))
        return kvb[..., : c.nope], kpe, kvb[..., c.nope :]

    def queries(self, u, pos):
        c, a = self.c, "layers.0.self_attn."
        cq = rms(u @ self.w(a + "q_a_proj.weight").T, self.w(a + "q_a_layernorm.weight"), c.eps)
        q = (cq @ self.w(a + "q_b_proj.weight").T).unflatten(-1, (c.heads, c.nope + c.rope))
        return q[..., : c.nope], self.rotate(q[..., c.nope :], pos, heads=True)

    def finish(self, h, attn):
        """r = h + attn; r += MLP(norm r); y = norm(r). Returns (next hidden, logits)."""
        c, L = self.c, "layers.0."
        r = h + attn
        x = rms(r, self.w(L + "post_attention_layernorm.weight"), c.eps)
        r = r + (torch.nn.functional.silu(x @ self.w(L + "mlp.gate_proj.weight").T)
                 * (x @ self.w(L + "mlp.up_proj.weight").T)) @ self.w(L + "mlp.down_proj.weight").T
        y = rms(r, self.w("norm.weight"), c.eps)
        return (y if c.norm_output else r), y @ self.w("lm_head.weight").T

    def out_proj(self, o):
        return o.flatten(-2) @ self.w("layers.0.self_attn.o_proj.weight").T

    # -- training: the chain unrolled to `depth` over [B, T] rows

    def unrolled(self, g, emb, depth):
        """g [B,R,H] fused real taps of rows p = 0..R-1; emb [B,R,H] = E[x_{p+1}]. Returns a list
        of logits [B,R,V], one per depth; at depth k rows p < k-1 are not meaningful."""
        B, R, H = g.shape
        pos = torch.arange(R)
        hs, out = g, []
        kn_all, kp_all, v_all = [], [], []
        causal = torch.tril(torch.ones(R, R, dtype=torch.bool))
        for k in range(1, depth + 1):
            u = self.layer_input(emb, hs)
            qn, qp = self.queries(u, pos)
            kn, kp, v = self.keys(u, pos)
            kn_all.append(kn), kp_all.append(kp), v_all.append(v)
            # real rows (depth 1) at positions <= p-k+1
            s1 = (torch.einsum("bphd,bqhd->bhpq", qn, kn_all[0]) +
                  torch.einsum("bphd,bqd->bhpq", qp, kp_all[0])) * self.score_scale
            s1 = s1.masked_fill(~torch.tril(causal, -(k - 1)), float("-inf"))
            # chain rows of depth m = 2..k at position p-(k-m) (one key each)
            sd, vd = [], []
            for m in range(2, k + 1):
                sh = k - m
                knm, kpm, vm = (torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (sh, 0))[:, :R]
                                for t in (kn_all[m - 1], kp_all[m - 1], v_all[m - 1]))
                sd.append(((qn * knm).sum(-1) + (qp * kpm.unsqueeze(2)).sum(-1)) * self.score_scale)
                vd.append(vm)
            scores = torch.cat([s1] + [s.permute(0, 2, 1).unsqueeze(-1) for s in sd], dim=-1)
            P = torch.softmax(scores, dim=-1)
            o = torch.einsum("bhpq,bqhd->bphd", P[..., :R], v_all[0])
            for i, vm in enumerate(vd):
                o = o + P[..., R + i].permute(0, 2, 1).unsqueeze(-1) * vm
            y, logits = self.finish(hs, self.out_proj(o))
            out.append(logits)
            hs = torch.nn.functional.pad(y, (0, 0, 1, 0))[:, :R]  # depth k+1 at p reads y_k[p-1]
        return out

    # -- inference, row by row as an engine runs it (for the cross-check)

    @torch.no_grad()
    def propose(self, taps, tokens, anchor, n, embed, forced=None):
        """taps [L, n_taps, H] of committed positions 0..L-1 (tokens x_0..x_{L-1}); anchor = x_L.
        Returns (draft ids, logits [n, V]) of a top-1 chain of n drafts (docs/DRAFT-MODELS.md §3.4);
        `forced` feeds given tokens down the chain instead of the argmax (a check of `unrolled`)."""
        L = len(tokens)
        g = self.fuse(taps)
        ks = []
        if L > 1:  # committed rows (g_p, x_{p+1}) for p = 0..L-2
            u = self.layer_input(embed[torch.tensor(tokens[1:])], g[: L - 1])
            ks.append(self.keys(u, torch.arange(L - 1)))
        h, x, ids, rows = g[L - 1], anchor, [], []
        for j in range(n):
            p = torch.tensor(L - 1 + j)
            u = self.layer_input(embed[x], h)
            ks.append(tuple(t.unsqueeze(0) for t in self.keys(u, p)))
            kn = torch.cat([k[0] for k in ks]), torch.cat([k[1] for k in ks]), torch.cat([k[2] for k in ks])
            qn, qp = self.queries(u, p)
            s = (torch.einsum("hd,qhd->hq", qn, kn[0]) + torch.einsum("hd,qd->hq", qp, kn[1])) * self.score_scale
            o = torch.einsum("hq,qhd->hd", torch.softmax(s, -1), kn[2])
            h, logits = self.finish(h, self.out_proj(o))
            x = int(logits.argmax()) if forced is None or j >= len(forced) else forced[j]
            ids.append(x)
            rows.append(logits)
        return ids, torch.stack(rows)


def yarn(c):
    """DeepSeek-V3 YaRN (docs/DRAFT-MODELS.md §5): inverse frequencies, cos/sin multiplier, score scale."""
    d = c.rope
    half = d // 2

    def mscale(f, m):
        return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0

    def corr(rot):
        return d * math.log(c.orig / (rot * 2 * math.pi)) / (2 * math.log(c.theta))

    low = max(math.floor(corr(c.beta_fast)), 0.0)
    high = min(math.ceil(corr(c.beta_slow)), d - 1.0)
    if low == high:
        high += 0.001
    inv = []
    for i in range(half):
        extra = 1.0 / c.theta ** (2 * i / d)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        inv.append(extra / c.factor * ramp + extra * (1 - ramp))
    cos_scale = mscale(c.factor, c.mscale) / mscale(c.factor, c.mscale_all)
    m = mscale(c.factor, c.mscale_all)
    return torch.tensor(inv, dtype=torch.float64), cos_scale, m * m / math.sqrt(c.nope + c.rope)


def export(model, out_dir):
    """The released layout: config.json + model.safetensors (BF16), no embed_tokens."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.c.j, f, indent=2)
        f.write("\n")
    items = [(n, "BF16", tuple(model.w(n).shape), k3.to_bf16_bytes(model.w(n))) for n in sorted(model.names())]
    k3.write_safetensors(os.path.join(out_dir, "model.safetensors"), items)


def load(draft_dir, dtype=torch.float64):
    with open(os.path.join(draft_dir, "config.json")) as f:
        cfg = DraftConfig(json.load(f))
    t = k3.read_safetensors(os.path.join(draft_dir, "model.safetensors"))
    return Eagle31(cfg, {n: v.to(dtype) for n, v in t.items() if n != "embed_tokens.weight"}).to(dtype)


__all__ = ["DraftConfig", "Eagle31", "config_json", "init_params", "export", "load", "np"]
