# An independent PyTorch implementation of the Kimi K3 text model, written from the K3
# specification (docs/MODEL.md states the math in the same section numbers) and deliberately
# sharing no code with the C++ engine: it trains the demo model, and as a second implementation
# it cross-checks the engine on trained weights.
# Batched over [B, T] for training; the KDA recurrence uses the exact chunkwise form (spec §3.5)
# with a triangular solve, so it is differentiable and has no per-token Python loop.
# Checkpoint I/O is a small hand-written safetensors reader/writer (Debian has no safetensors
# package); MXFP4 helpers follow spec §2.5 (low nibble = even column, E8M0 scale per 32).
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

PREFIX = "language_model."

# ---------------------------------------------------------------- safetensors


def read_safetensors(path):
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = data[a:b]
        dt = meta["dtype"]
        shape = meta["shape"]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            t = torch.from_numpy(u.view(np.float32).copy())
        elif dt == "F32":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
        elif dt == "U8":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        out[name] = t.reshape(shape)
    return out


def read_checkpoint(model_dir):
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(read_safetensors(os.path.join(model_dir, shard)))
    return tensors


def to_bf16_bytes(t):
    """Round-to-nearest-even fp32 -> bf16, as raw little-endian bytes."""
    u = t.detach().to(torch.float32).contiguous().numpy().view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def bf16_round(t):
    u = np.frombuffer(to_bf16_bytes(t), dtype=np.uint16).astype(np.uint32) << 16
    return torch.from_numpy(u.view(np.float32).copy()).reshape(t.shape)


def write_safetensors(path, items):
    """items: list of (name, dtype string, shape, bytes)."""
    header, offset = {}, 0
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, raw in items:
            f.write(raw)


# ---------------------------------------------------------------- MXFP4

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def mxfp4_dequant(packed, scale):
    lo = (packed & 0xF).long()
    hi = (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)
    vals = E2M1[codes]
    e = scale.double() - 127.0
    s = torch.pow(2.0, e).repeat_interleave(32, dim=1)
    return vals * s


def mxfp4_quant(w):
    """Max-abs/6 per 32-group, E8M0 scale rounded up so every value fits, nearest E2M1 code."""
    w = w.detach().double()
    r, c = w.shape
    g = w.reshape(r, c // 32, 32)
    amax = g.abs().amax(dim=-1).clamp_min(2.0 ** -126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scale = (e + 127).to(torch.uint8)
    x = g / torch.pow(2.0, e).unsqueeze(-1)
    mags = E2M1[:8]
    idx = (x.abs().unsqueeze(-1) - mags).abs().argmin(dim=-1)
    codes = idx + 8 * (x < 0).long() * (idx > 0).long()
    codes = codes.reshape(r, c)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale


# ---------------------------------------------------------------- model


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def situ(g, u):
    return 4.0 * torch.tanh(g / 4.0) * torch.sigmoid(g) * 25.0 * torch.tanh(u / 25.0)


class Config:
    def __init__(self, tc):
        self.tc = tc
        self.hidden = tc["hidden_size"]
        self.layers = tc["num_hidden_layers"]
        self.vocab = tc["vocab_size"]
        self.eps = tc["rms_norm_eps"]
        la = tc["linear_attn_config"]
        self.mla_layers = {i - 1 for i in la["full_attn_layers"]}
        self.kda_heads = la["num_heads"]
        self.kda_dim = la["head_dim"]
        self.conv = la["short_conv_kernel_size"]
        self.mla_heads = tc["num_attention_heads"]
        self.q_lora = tc["q_lora_rank"]
        self.kv_lora = tc["kv_lora_rank"]
        self.nope = tc["qk_nope_head_dim"]
        self.rope = tc["qk_rope_head_dim"]
        self.vdim = tc["v_head_dim"]
        self.experts = tc["num_experts"]
        self.topk = tc["num_experts_per_token"]
        self.latent = tc["routed_expert_hidden_size"]
        self.moe_inter = tc["moe_intermediate_size"]
        self.dense_k = tc["first_k_dense_replace"]
        self.block = tc["attn_res_block_size"]
        self.scaling = tc["routed_scaling_factor"]


def kda_chunk(q, k, v, g, beta, chunk):
    """q,k,v: [B,H,T,D]; g: [B,H,T,D] log-decay (<=0); beta: [B,H,T]. Exact chunkwise delta rule."""
    B, H, T, D = q.shape
    S = torch.zeros(B, H, D, v.shape[-1], dtype=q.dtype)
    outs = []
    for s in range(0, T, chunk):
        qc, kc, vc, gc, bc = (t[:, :, s : s + chunk] for t in (q, k, v, g, beta))
        C = qc.shape[2]
        G = gc.cumsum(dim=2)  # [B,H,C,D]
        diff = G.unsqueeze(3) - G.unsqueeze(2)  # [B,H,r,i,D] = G_r - G_i
        mask_strict = torch.tril(torch.ones(C, C, dtype=torch.bool), -1)
        mask_incl = torch.tril(torch.ones(C, C, dtype=torch.bool), 0)
        decay = torch.exp(diff.masked_fill(~mask_incl.unsqueeze(-1), -1e9 if q.dtype == torch.float32 else -1e300))
        A = torch.einsum("bhrd,bhid,bhrid->bhri", kc, kc, decay) * mask_strict
        rhs = bc.unsqueeze(-1) * (vc - torch.einsum("bhrd,bhdv->bhrv", torch.exp(G) * kc, S))
        L = torch.eye(C, dtype=q.dtype) + bc.unsqueeze(-1) * A
        delta = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
        Pq = torch.einsum("bhid,bhrd,bhrid->bhri", kc, qc, decay) * mask_incl
        o = torch.einsum("bhrd,bhdv->bhrv", torch.exp(G) * qc, S) + torch.einsum("bhri,bhiv->bhrv", Pq, delta)
        outs.append(o)
        GC = G[:, :, -1:, :]  # [B,H,1,D]
        S = torch.exp(GC.squeeze(2)).unsqueeze(-1) * S + torch.einsum(
            "bhid,bhiv->bhdv", torch.exp(GC - G) * kc, delta
        )
    return torch.cat(outs, dim=2)


class K3(torch.nn.Module):
    """Parameters are held in a dict keyed by the release tensor names (without the prefix)."""

    def __init__(self, cfg, params, chunk=32):
        super().__init__()
        self.cfg = cfg
        self.chunk = chunk
        self.names = sorted(params)
        self.p = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(t) for n, t in params.items()})

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def has(self, name):
        return name.replace(".", "__") in self.p

    def mix(self, cands, pre):
        wn, wp = self.w(pre + "_norm.weight"), self.w(pre + "_proj.weight")[0]
        st = torch.stack(cands, dim=0)  # [N,B,T,H]
        r = st / torch.sqrt((st * st).mean(-1, keepdim=True) + self.cfg.eps)
        s = (r * (wn * wp)).sum(-1)
        pi = torch.softmax(s, dim=0)
        return (pi.unsqueeze(-1) * st).sum(0)

    def kda(self, u, L):
        c = self.cfg
        B, T, _ = u.shape
        H, D = c.kda_heads, c.kda_dim
        pre = f"model.layers.{L}.self_attn."

        def conv(x, name):
            wt = self.w(pre + name)  # [C,1,K]
            xp = F.pad(x.transpose(1, 2), (c.conv - 1, 0))
            return F.silu(F.conv1d(xp, wt, groups=wt.shape[0]).transpose(1, 2))

        q = conv(u @ self.w(pre + "q_proj.weight").T, "q_conv1d.weight").reshape(B, T, H, D)
        k = conv(u @ self.w(pre + "k_proj.weight").T, "k_conv1d.weight").reshape(B, T, H, D)
        v = conv(u @ self.w(pre + "v_proj.weight").T, "v_conv1d.weight").reshape(B, T, H, D)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * D ** -0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        z = (u @ self.w(pre + "f_a_proj.weight").T) @ self.w(pre + "f_b_proj.weight").T + self.w(pre + "dt_bias")
        A = torch.exp(self.w(pre + "A_log")[:H]).reshape(1, 1, H, 1)
        g = -5.0 * torch.sigmoid(A * z.reshape(B, T, H, D))
        beta = torch.sigmoid(u @ self.w(pre + "b_proj.weight").T)  # [B,T,H]
        tr = lambda t: t.permute(0, 2, 1, 3)
        o = kda_chunk(tr(q), tr(k), tr(v), tr(g), beta.transpose(1, 2), self.chunk)
        o = o.permute(0, 2, 1, 3)  # [B,T,H,D]
        gate = torch.sigmoid(u @ self.w(pre + "g_proj.weight").T).reshape(B, T, H, D)
        o = rms(o, self.w(pre + "o_norm.weight"), c.eps) * gate
        return o.reshape(B, T, H * D) @ self.w(pre + "o_proj.weight").T

    def mla(self, u, L):
        c = self.cfg
        B, T, _ = u.shape
        H = c.mla_heads
        pre = f"model.layers.{L}.self_attn."
        cq = rms(u @ self.w(pre + "q_a_proj.weight").T, self.w(pre + "q_a_layernorm.weight"), 1e-6)
        q = (cq @ self.w(pre + "q_b_proj.weight").T).reshape(B, T, H, c.nope + c.rope)
        ckv = u @ self.w(pre + "kv_a_proj_with_mqa.weight").T
        lat = rms(ckv[..., : c.kv_lora], self.w(pre + "kv_a_layernorm.weight"), 1e-6)
        kpe = ckv[..., c.kv_lora :]  # [B,T,rope]
        kv = (lat @ self.w(pre + "kv_b_proj.weight").T).reshape(B, T, H, c.nope + c.vdim)
        kn, vv = kv[..., : c.nope], kv[..., c.nope :]
        qn, qp = q[..., : c.nope], q[..., c.nope :]
        s = torch.einsum("bihd,bjhd->bhij", qn, kn) + torch.einsum("bihd,bjd->bhij", qp, kpe)
        s = s / math.sqrt(c.nope + c.rope)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        s = s.masked_fill(causal, float("-inf"))
        P = torch.softmax(s, dim=-1)
        o = torch.einsum("bhij,bjhd->bihd", P, vv).reshape(B, T, H * c.vdim)
        gate = torch.sigmoid(u @ self.w(pre + "g_proj.weight").T)
        return (o * gate) @ self.w(pre + "o_proj.weight").T

    def mlp(self, x, pre):
        return situ(x @ self.w(pre + "gate_proj.weight").T, x @ self.w(pre + "up_proj.weight").T) @ self.w(
            pre + "down_proj.weight"
        ).T

    def moe(self, x, L, stats=None):
        c = self.cfg
        pre = f"model.layers.{L}.block_sparse_moe."
        logits = x @ self.w(pre + "gate.weight").T
        s = torch.sigmoid(logits)
        sel = torch.topk(s + self.w(pre + "gate.e_score_correction_bias"), c.topk, dim=-1).indices
        ws = torch.gather(s, -1, sel)
        ws = ws / (ws.sum(-1, keepdim=True) + 1e-20) * c.scaling
        xi = x @ self.w(pre + "routed_expert_down_proj.weight").T
        W1 = self.w(pre + "experts.w1")  # [E, inter, latent] stacked
        W3 = self.w(pre + "experts.w3")
        W2 = self.w(pre + "experts.w2")  # [E, latent, inter]
        flat, fsel, fws = xi.reshape(-1, xi.shape[-1]), sel.reshape(-1, c.topk), ws.reshape(-1, c.topk)
        ybar = torch.zeros_like(flat)
        for e in range(c.experts):
            rows, slot = torch.nonzero(fsel == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = flat[rows]
            y = situ(xe @ W1[e].T, xe @ W3[e].T) @ W2[e].T
            ybar = ybar.index_add(0, rows, y * fws[rows, slot].unsqueeze(-1))
        ybar = ybar.reshape(xi.shape)
        routed = rms(ybar, self.w(pre + "routed_expert_norm.weight"), c.eps) @ self.w(
            pre + "routed_expert_up_proj.weight"
        ).T
        if stats is not None:
            stats.append((L, s.detach(), sel.detach()))
        return routed + self.mlp(x, pre + "shared_experts.")

    def forward(self, tokens, stats=None, taps=None, h0=None):
        """Logits [B,T,V]; with `taps` (0-based layers), also the raw within-block Attention-Residual
        partial sum after each of those layers, [B,T,len(taps),H] (the vector EAGLE-3 drafters read,
        docs/DRAFT-MODELS.md §2). `h0` [B,T,H], when given, is the input embedding rows instead of
        the tokens' (K3's image rows in place of <|media_pad|>, docs/VISION.md §6)."""
        c = self.cfg
        tapped = {}
        if h0 is None:
            h0 = self.w("model.embed_tokens.weight")[tokens]
        anchors, p = [], h0
        for i in range(c.layers):
            pre = f"model.layers.{i}."
            a = p if not anchors else self.mix(anchors + [p], pre + "self_attention_res")
            if i % c.block == 0:
                anchors.append(p)
                p = None
            u = rms(a, self.w(pre + "input_layernorm.weight"), c.eps)
            y = self.mla(u, i) if i in c.mla_layers else self.kda(u, i)
            p = y if p is None else p + y
            m = self.mix(anchors + [p], pre + "mlp_res")
            x = rms(m, self.w(pre + "post_attention_layernorm.weight"), c.eps)
            z = self.mlp(x, pre + "mlp.") if i < c.dense_k else self.moe(x, i, stats)
            p = p + z
            if taps is not None and i in taps:
                tapped[i] = p
        out = self.mix(anchors + [p], "model.output_attn_res")
        logits = rms(out, self.w("model.norm.weight"), c.eps) @ self.w("lm_head.weight").T
        if taps is None:
            return logits
        return logits, torch.stack([tapped[i] for i in taps], dim=2)


def stack_experts(tensors, cfg, dtype):
    """Release tensors (prefix stripped) -> model params, with experts dequantised and stacked."""
    params = {}
    per = {}
    for n, t in tensors.items():
        if ".experts." in n:
            head, rest = n.split(".experts.")
            e, wname, kind = rest.split(".")
            per.setdefault((head, wname), {}).setdefault(int(e), {})[kind] = t
        else:
            params[n] = t.to(dtype)
    for (head, wname), d in per.items():
        mats = []
        for e in range(cfg.experts):
            if "weight_packed" in d[e]:
                mats.append(mxfp4_dequant(d[e]["weight_packed"], d[e]["weight_scale"]))
            else:
                mats.append(d[e]["weight"].double())
        params[f"{head}.experts.{wname}"] = torch.stack(mats).to(dtype)
    return params


def load(model_dir, dtype=torch.float64, chunk=32):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config(json.load(f)["text_config"])
    raw = read_checkpoint(model_dir)
    tensors = {n[len(PREFIX) :]: t for n, t in raw.items() if n.startswith(PREFIX)}
    return K3(cfg, stack_experts(tensors, cfg, dtype), chunk)
