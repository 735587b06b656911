# An independent float64 reference of the DeepSeek-V3 architecture as the Kimi K2 family and
# DeepSeek-V3/V3.1 release it (Kimi-K2-Instruct-0905: FP8 block-scaled; K2-Thinking: INT4
# pack-quantized routed experts; K2.5: the same text model under `language_model.`;
# DeepSeek-V3/V3.1: FP8 plus one MTP layer). It is written from docs/FAMILY.md
# "## DeepSeek-V3 and Kimi K2" (section names are cited as FAMILY §...) and shares no code with
# the engine, so its logits can serve as goldens for the C++ implementation.
#
# Why it is built this way:
# - float64 everywhere after an exact dequantisation (FP8 code x F32 block scale, INT4 x BF16
#   group scale are exact in float64), so the only rounding left is float64's and the three pass
#   modes (prefill, one token at a time, prefix + rest) agree to ~1e-12: any larger difference
#   in the engine is the engine's.
# - Attention is computed in the expanded form (per-head keys and values rebuilt from the
#   cached latents) by default, and in the absorbed form on request, so the engine's absorbed
#   kernels are checked against a different formulation of the same math.
# - Ties in top-k go to the lower index (stable sort), stated in FAMILY §Router, because the
#   public code's torch.topk leaves them unspecified.
# - The checkpoint is validated against the full expected inventory (names, shapes, dtypes)
#   before any compute: that list is the contract the C++ loader and make-model presets follow.
# Debian python3-torch (1.13) and numpy only.
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

torch.set_default_dtype(torch.float64)

LATENT_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: fixed, never rms_norm_eps (FAMILY §Norms)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
IGNORED_PREFIXES_K25 = ("vision_tower.", "mm_projector.")

# ---------------------------------------------------------------- configuration


class Config:
    """The text config of one release layout (FAMILY §Config)."""

    def __init__(self, top):
        self.top = top
        if isinstance(top.get("text_config"), dict):
            self.layout = "k25"  # KimiK25ForConditionalGeneration: text model under language_model.
            tc = top["text_config"]
            self.prefix = "language_model."
        else:
            self.layout = "flat"  # DeepseekV3ForCausalLM as released (K2, K2-Thinking, DS-V3)
            tc = top
            self.prefix = ""
        self.tc = tc
        archs = tc.get("architectures") or []
        if "DeepseekV3ForCausalLM" not in archs and tc.get("model_type") not in ("deepseek_v3", "kimi_k2"):
            raise ValueError(f"config: text model is {archs} / {tc.get('model_type')!r}, expected DeepseekV3ForCausalLM")

        def need(key, kind=int):
            if key not in tc:
                raise ValueError(f"config: field {key!r} is missing")
            v = tc[key]
            if kind is int and not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"config: {key} = {v!r}, expected a positive integer")
            if kind is float and not isinstance(v, (int, float)):
                raise ValueError(f"config: {key} = {v!r}, expected a number")
            return v

        self.hidden = need("hidden_size")
        self.layers = need("num_hidden_layers")
        self.vocab = need("vocab_size")
        self.heads = need("num_attention_heads")
        self.q_lora = tc.get("q_lora_rank")  # None: a plain q_proj (DeepSeek-V2-Lite style)
        self.kv_lora = need("kv_lora_rank")
        self.nope = need("qk_nope_head_dim")
        self.rope = need("qk_rope_head_dim")
        self.vdim = need("v_head_dim")
        self.inter = need("intermediate_size")
        self.moe_inter = need("moe_intermediate_size")
        self.experts = need("n_routed_experts")
        self.topk = need("num_experts_per_tok")
        self.shared = tc.get("n_shared_experts") or 0
        self.n_group = tc.get("n_group") or 1
        self.topk_group = tc.get("topk_group") or 1
        self.norm_topk = bool(tc.get("norm_topk_prob", False))
        self.scaling = float(need("routed_scaling_factor", float))
        self.dense_k = tc.get("first_k_dense_replace", 0)
        self.moe_freq = tc.get("moe_layer_freq", 1)
        self.eps = float(need("rms_norm_eps", float))
        self.theta = float(need("rope_theta", float))
        self.rope_scaling = tc.get("rope_scaling")
        self.nextn = tc.get("num_nextn_predict_layers") or 0
        self.tied = bool(tc.get("tie_word_embeddings", False))
        if tc.get("scoring_func", "sigmoid") != "sigmoid" or tc.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError(f"config: routing {tc.get('scoring_func')}/{tc.get('topk_method')}, only sigmoid/noaux_tc")
        if tc.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config: hidden_act {tc.get('hidden_act')!r}, expected silu")
        if self.rope % 2:
            raise ValueError(f"config: qk_rope_head_dim {self.rope} is odd")
        if self.experts % self.n_group or self.experts // self.n_group < 2 or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"config: {self.experts} experts in {self.n_group} groups, topk_group {self.topk_group}")
        if self.topk > (self.experts // self.n_group) * self.topk_group:
            raise ValueError(f"config: top-{self.topk} cannot be chosen from {self.topk_group} groups")
        q = tc.get("quantization_config") or top.get("quantization_config")
        self.quant = None
        if q:
            method = q.get("quant_method")
            if method == "fp8":
                bs = q.get("weight_block_size")
                if q.get("fmt", "e4m3") != "e4m3" or not (isinstance(bs, list) and len(bs) == 2):
                    raise ValueError(f"config: fp8 quantization_config {q}, expected fmt e4m3 and a 2-d weight_block_size")
                self.quant = ("fp8", tuple(bs))
            elif method == "compressed-tensors":
                if q.get("format") != "pack-quantized":
                    raise ValueError(f"config: compressed-tensors format {q.get('format')!r}, only pack-quantized")
                groups = list((q.get("config_groups") or {}).values())
                if len(groups) != 1:
                    raise ValueError("config: compressed-tensors needs exactly one config group")
                w = groups[0].get("weights") or {}
                ok = (w.get("num_bits") == 4 and w.get("type", "int") == "int" and w.get("symmetric") is True
                      and w.get("strategy") == "group" and isinstance(w.get("group_size"), int))
                if not ok:
                    raise ValueError(f"config: pack-quantized weights {w}, expected int4 symmetric group")
                self.quant = ("int4", w["group_size"])
            else:
                raise ValueError(f"config: quant_method {method!r} is not supported")

    def is_moe(self, i):
        """Layer i (main layers and MTP layers alike) has the MoE FFN (FAMILY §Layers)."""
        return i >= self.dense_k and i % self.moe_freq == 0

    @staticmethod
    def from_dir(model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return Config(json.load(f))


# ---------------------------------------------------------------- dequantisation (FAMILY §FP8, §INT4)


def e4m3fn_values():
    """Code -> value for FP8 E4M3FN: sign bit 7, exponent bits 6..3 (bias 7), mantissa 2..0;
    exponent 0 is subnormal m/8 * 2^-6; 0x7F and 0xFF are NaN; no infinities."""
    t = np.empty(256)
    for code in range(256):
        s = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 0xF, code & 7
        if e == 15 and m == 7:
            t[code] = np.nan
        elif e == 0:
            t[code] = s * m * 2.0 ** -9
        else:
            t[code] = s * (8 + m) * 2.0 ** (e - 10)
    return t


E4M3 = e4m3fn_values()


def dequant_fp8(name, w, s, block):
    """W[r, c] = e4m3(code[r, c]) * scale_inv[r // b0, c // b1], edge blocks ragged."""
    R, C = w.shape
    b0, b1 = block
    want = (-(-R // b0), -(-C // b1))
    if s.dtype != "F32" or s.shape != want:
        raise ValueError(f"{name}_scale_inv: {s.dtype}{list(s.shape)}, expected F32{list(want)}")
    codes = w.raw.astype(np.int64)
    if np.isnan(E4M3[codes]).any():
        raise ValueError(f"{name}: holds FP8 NaN codes (0x7F/0xFF)")
    scale = s.raw.astype(np.float64).repeat(b0, 0).repeat(b1, 1)[:R, :C]
    return E4M3[codes] * scale


def dequant_int4(name, packed, scale, shape, group):
    """compressed-tensors pack-quantized, symmetric int4: column 8j+i is bits 4i..4i+3 of int32
    word j of its row, stored as q + 8; W[r, c] = q * scale[r, c // group]."""
    if shape.dtype not in ("I32", "I64") or shape.shape != (2,):
        raise ValueError(f"{name}_shape: {shape.dtype}{list(shape.shape)}, expected I32/I64 [2]")
    R, C = (int(v) for v in shape.raw)
    if packed.dtype != "I32" or packed.shape != (R, -(-C // 8)):
        raise ValueError(f"{name}_packed: {packed.dtype}{list(packed.shape)}, expected I32[{R}, {-(-C // 8)}]")
    if scale.dtype not in ("BF16", "F32") or scale.shape != (R, -(-C // group)):
        raise ValueError(f"{name}_scale: {scale.dtype}{list(scale.shape)}, expected BF16[{R}, {-(-C // group)}]")
    words = packed.raw.view(np.uint32).astype(np.int64)
    nib = np.stack([(words >> (4 * i)) & 0xF for i in range(8)], axis=-1).reshape(R, -1)[:, :C]
    sc = st.bf16_value(scale.raw) if scale.dtype == "BF16" else scale.raw.astype(np.float64)
    return (nib - 8).astype(np.float64) * sc.repeat(group, 1)[:, :C]


def plain(name, t):
    if t.dtype == "BF16":
        return st.bf16_value(t.raw)
    if t.dtype in ("F32", "F16", "F64"):
        return t.raw.astype(np.float64)
    raise ValueError(f"{name}: dtype {t.dtype} where a float tensor was expected")


# ---------------------------------------------------------------- inventory (FAMILY §Tensors)


def layer_linears(cfg, i):
    """(name suffix within model.layers.{i}., [out, in], routed-expert?) of every linear."""
    c, out = cfg, []
    qk = c.nope + c.rope
    if c.q_lora:
        out += [("self_attn.q_a_proj", [c.q_lora, c.hidden], False),
                ("self_attn.q_b_proj", [c.heads * qk, c.q_lora], False)]
    else:
        out += [("self_attn.q_proj", [c.heads * qk, c.hidden], False)]
    out += [("self_attn.kv_a_proj_with_mqa", [c.kv_lora + c.rope, c.hidden], False),
            ("self_attn.kv_b_proj", [c.heads * (c.nope + c.vdim), c.kv_lora], False),
            ("self_attn.o_proj", [c.hidden, c.heads * c.vdim], False)]
    if cfg.is_moe(i):
        for e in range(c.experts):
            out += [(f"mlp.experts.{e}.gate_proj", [c.moe_inter, c.hidden], True),
                    (f"mlp.experts.{e}.up_proj", [c.moe_inter, c.hidden], True),
                    (f"mlp.experts.{e}.down_proj", [c.hidden, c.moe_inter], True)]
        if c.shared:
            si = c.shared * c.moe_inter
            out += [("mlp.shared_experts.gate_proj", [si, c.hidden], False),
                    ("mlp.shared_experts.up_proj", [si, c.hidden], False),
                    ("mlp.shared_experts.down_proj", [c.hidden, si], False)]
    else:
        out += [("mlp.gate_proj", [c.inter, c.hidden], False),
                ("mlp.up_proj", [c.inter, c.hidden], False),
                ("mlp.down_proj", [c.hidden, c.inter], False)]
    return out


def layer_vectors(cfg, i):
    """(name, shape) of the non-linear tensors of decoder layer i."""
    c = cfg
    out = [("input_layernorm.weight", [c.hidden]), ("post_attention_layernorm.weight", [c.hidden]),
           ("self_attn.kv_a_layernorm.weight", [c.kv_lora])]
    if c.q_lora:
        out.append(("self_attn.q_a_layernorm.weight", [c.q_lora]))
    if cfg.is_moe(i):
        out += [("mlp.gate.weight", [c.experts, c.hidden]), ("mlp.gate.e_score_correction_bias", [c.experts])]
    return out


def expected_inventory(cfg):
    """name (without the layout prefix) -> (kind, shape): kind 'plain' (BF16/F32),
    'linear' (a weight that may be quantised per the config) or 'expert' (a routed expert)."""
    inv = {"model.embed_tokens.weight": ("plain", [cfg.vocab, cfg.hidden]),
           "model.norm.weight": ("plain", [cfg.hidden])}
    if not cfg.tied:
        inv["lm_head.weight"] = ("plain", [cfg.vocab, cfg.hidden])
    for i in range(cfg.layers + cfg.nextn):
        p = f"model.layers.{i}."
        for n, shape in layer_vectors(cfg, i):
            inv[p + n] = ("plain", shape)
        for n, shape, routed in layer_linears(cfg, i):
            inv[p + n + ".weight"] = ("expert" if routed else "linear", shape)
        if i >= cfg.layers:  # an MTP layer (FAMILY §MTP)
            inv[p + "embed_tokens.weight"] = ("plain", [cfg.vocab, cfg.hidden])
            inv[p + "enorm.weight"] = ("plain", [cfg.hidden])
            inv[p + "hnorm.weight"] = ("plain", [cfg.hidden])
            inv[p + "eh_proj.weight"] = ("mtp_linear", [cfg.hidden, 2 * cfg.hidden])
            inv[p + "shared_head.norm.weight"] = ("plain", [cfg.hidden])
            inv[p + "shared_head.head.weight"] = ("plain", [cfg.vocab, cfg.hidden])
    return inv


def load_weights(cfg, tensors):
    """Validate the stored tensors against the inventory and return name -> float64 torch
    tensor, every quantised linear dequantised. Raises one error naming every problem."""
    problems, out, used = [], {}, set()
    pre = cfg.prefix
    inv = expected_inventory(cfg)
    for name, (kind, shape) in inv.items():
        full = pre + name
        try:
            if kind in ("linear", "expert", "mtp_linear") and name.endswith(".weight"):
                base = full[: -len(".weight")]
                if cfg.quant and cfg.quant[0] == "int4" and kind == "expert":
                    for sfx in ("_packed", "_scale", "_shape"):
                        if base + ".weight" + sfx not in tensors:
                            raise ValueError(f"{base}.weight{sfx} is missing (routed experts are pack-quantized)")
                        used.add(base + ".weight" + sfx)
                    w = dequant_int4(base + ".weight", tensors[base + ".weight_packed"], tensors[base + ".weight_scale"],
                                     tensors[base + ".weight_shape"], cfg.quant[1])
                else:
                    if full not in tensors:
                        raise ValueError(f"{full} is missing")
                    t = tensors[full]
                    used.add(full)
                    fp8_expected = cfg.quant and cfg.quant[0] == "fp8" and kind != "mtp_linear"
                    if t.dtype == "F8_E4M3":
                        if not (cfg.quant and cfg.quant[0] == "fp8"):
                            raise ValueError(f"{full} is F8_E4M3 but the config has no fp8 quantization_config")
                        if full + "_scale_inv" not in tensors:
                            raise ValueError(f"{full}_scale_inv is missing")
                        used.add(full + "_scale_inv")
                        w = dequant_fp8(full, t, tensors[full + "_scale_inv"], cfg.quant[1])
                    elif fp8_expected:
                        raise ValueError(f"{full} is {t.dtype}, the fp8 release stores it as F8_E4M3")
                    else:
                        w = plain(full, t)
                if list(w.shape) != shape:
                    raise ValueError(f"{full}: logical shape {list(w.shape)}, expected {shape}")
            else:
                if full not in tensors:
                    raise ValueError(f"{full} is missing")
                t = tensors[full]
                used.add(full)
                if list(t.shape) != shape:
                    raise ValueError(f"{full}: shape {list(t.shape)}, expected {shape}")
                if name.endswith("e_score_correction_bias") and t.dtype not in ("F32", "BF16"):
                    raise ValueError(f"{full}: dtype {t.dtype}, expected F32")
                w = plain(full, t)
            out[name] = torch.from_numpy(np.ascontiguousarray(w))
        except ValueError as err:
            problems.append(str(err))
    for name in tensors:
        if name in used or name.endswith(IGNORED_SUFFIXES):
            continue
        if cfg.layout == "k25" and name.startswith(IGNORED_PREFIXES_K25):
            continue
        problems.append(f"{name}: not part of the {cfg.layout} layout")
    if problems:
        raise ValueError("checkpoint does not match its config:\n  " + "\n  ".join(problems))
    if cfg.tied:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


# ---------------------------------------------------------------- RoPE (FAMILY §RoPE)


def yarn_mscale(factor, m):
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def rope_tables(cfg):
    """(inv_freq[rope/2], cos/sin multiplier, softmax scale), all float64."""
    d, base = cfg.rope, cfg.theta
    extra = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    scale = (cfg.nope + cfg.rope) ** -0.5
    rs = cfg.rope_scaling
    if not rs:
        return extra, 1.0, scale
    kind = rs.get("type", rs.get("rope_type"))
    if kind != "yarn":
        raise ValueError(f"config: rope_scaling type {kind!r}, only yarn")
    factor = float(rs["factor"])
    orig = float(rs["original_max_position_embeddings"])
    beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))
    m, m_all = float(rs.get("mscale", 1)), float(rs.get("mscale_all_dim", 0))

    def corr(rot):
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv = extra / factor * ramp + extra * (1.0 - ramp)
    cs = yarn_mscale(factor, m) / yarn_mscale(factor, m_all)
    return inv, cs, scale * yarn_mscale(factor, m_all) ** 2


def rotate(x, pos, inv, cs):
    """Interleaved pairs: (x[2i], x[2i+1]) rotated by pos * inv[i]; x [..., T, (H,) d], pos [T]."""
    ang = torch.from_numpy(np.outer(pos, inv))  # [T, d/2]
    cos, sin = torch.cos(ang) * cs, torch.sin(ang) * cs
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


# ---------------------------------------------------------------- model


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def silu(x):
    return x * torch.sigmoid(x)


def topk_lower_id(x, k):
    """Indices of the k largest entries per row, ties to the lower index, ascending."""
    order = torch.sort(-x, dim=-1, stable=True).indices[..., :k]
    return torch.sort(order, dim=-1).values


class State:
    """Per-sequence cache: every layer's normed latent c [N, kv_lora] and rotated k_pe [N, rope]
    (FAMILY §MLA: the absorbed cache), and the same for each MTP layer over its own rows."""

    def __init__(self, cfg):
        n = cfg.layers + cfg.nextn
        self.c = [torch.zeros(0, cfg.kv_lora) for _ in range(n)]
        self.kpe = [torch.zeros(0, cfg.rope) for _ in range(n)]
        self.pos = 0  # rows committed in the main layers
        self.mtp_pos = 0  # rows committed in the MTP layer


class DeepseekV3:
    def __init__(self, cfg, weights, absorbed=False):
        self.cfg, self.w, self.absorbed = cfg, weights, absorbed
        self.inv, self.cs, self.scale = rope_tables(cfg)

    def W(self, name):
        return self.w[name]

    def attention(self, u, i, positions, state):
        c, p = self.cfg, f"model.layers.{i}.self_attn."
        T, H = u.shape[0], c.heads
        if c.q_lora:
            cq = rms(u @ self.W(p + "q_a_proj.weight").T, self.W(p + "q_a_layernorm.weight"), LATENT_EPS)
            q = cq @ self.W(p + "q_b_proj.weight").T
        else:
            q = u @ self.W(p + "q_proj.weight").T
        q = q.reshape(T, H, c.nope + c.rope)
        q_nope, q_pe = q[..., : c.nope], rotate(q[..., c.nope :], positions, self.inv, self.cs)
        ckv = u @ self.W(p + "kv_a_proj_with_mqa.weight").T
        lat = rms(ckv[:, : c.kv_lora], self.W(p + "kv_a_layernorm.weight"), LATENT_EPS)
        kpe = rotate(ckv[:, c.kv_lora :], positions, self.inv, self.cs)
        state.c[i] = torch.cat([state.c[i], lat])
        state.kpe[i] = torch.cat([state.kpe[i], kpe])
        C, K = state.c[i], state.kpe[i]  # all rows 0..N-1 of this sequence
        N = C.shape[0]
        wkv = self.W(p + "kv_b_proj.weight").reshape(H, c.nope + c.vdim, c.kv_lora)
        wk, wv = wkv[:, : c.nope, :], wkv[:, c.nope :, :]
        rope_part = torch.einsum("thd,nd->htn", q_pe, K)
        if self.absorbed:
            qt = torch.einsum("thd,hdl->thl", q_nope, wk)  # q~ = Wk_h^T q_nope
            s = torch.einsum("thl,nl->htn", qt, C) + rope_part
        else:
            k_nope = torch.einsum("hdl,nl->nhd", wk, C)
            s = torch.einsum("thd,nhd->htn", q_nope, k_nope) + rope_part
        s = s * self.scale
        key_pos = torch.arange(N)
        mask = key_pos.unsqueeze(0) > torch.as_tensor(positions).unsqueeze(1)  # [T, N] future keys
        s = s.masked_fill(mask.unsqueeze(0), float("-inf"))
        P = torch.softmax(s, dim=-1)
        if self.absorbed:
            ob = torch.einsum("htn,nl->thl", P, C)
            o = torch.einsum("thl,hvl->thv", ob, wv)
        else:
            v = torch.einsum("hvl,nl->nhv", wv, C)
            o = torch.einsum("htn,nhv->thv", P, v)
        return o.reshape(T, H * c.vdim) @ self.W(p + "o_proj.weight").T

    def mlp(self, x, p):
        return (silu(x @ self.W(p + "gate_proj.weight").T) * (x @ self.W(p + "up_proj.weight").T)) @ self.W(
            p + "down_proj.weight"
        ).T

    def selection_scores(self, x, i):
        """(sigmoid scores s [T, E], biased scores with experts of dropped groups at -inf)."""
        c, p = self.cfg, f"model.layers.{i}.mlp.gate."
        s = torch.sigmoid(x @ self.W(p + "weight").T)
        b = s + self.W(p + "e_score_correction_bias")
        if c.n_group > 1:
            g = b.reshape(-1, c.n_group, c.experts // c.n_group)
            top2 = torch.sort(g, dim=-1, descending=True).values[..., :2].sum(-1)  # [T, n_group]
            keep = topk_lower_id(top2, c.topk_group)
            gmask = torch.zeros_like(top2, dtype=torch.bool).scatter_(1, keep, True)
            emask = gmask.unsqueeze(-1).expand_as(g).reshape(b.shape)
            b = b.masked_fill(~emask, float("-inf"))
        return s, b

    def route(self, x, i):
        """(selected expert ids [T, k] ascending, weights [T, k]) (FAMILY §Router)."""
        c = self.cfg
        s, b = self.selection_scores(x, i)
        sel = topk_lower_id(b, c.topk)
        w = torch.gather(s, 1, sel)
        if c.norm_topk and c.topk > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return sel, w * c.scaling

    def moe(self, x, i):
        c, p = self.cfg, f"model.layers.{i}.mlp."
        sel, w = self.route(x, i)
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(c.topk):  # ascending expert id
                e = int(sel[t, j])
                y[t] += w[t, j] * self.mlp(x[t : t + 1], p + f"experts.{e}.")[0]
        if c.shared:
            y = y + self.mlp(x, p + "shared_experts.")
        return y

    def layer(self, h, i, positions, state):
        c, p = self.cfg, f"model.layers.{i}."
        h = h + self.attention(rms(h, self.W(p + "input_layernorm.weight"), c.eps), i, positions, state)
        x = rms(h, self.W(p + "post_attention_layernorm.weight"), c.eps)
        return h + (self.moe(x, i) if c.is_moe(i) else self.mlp(x, p + "mlp."))

    def forward(self, state, tokens):
        """Rows state.pos .. state.pos+T-1: (logits [T, V], final-normed hidden [T, H])."""
        c = self.cfg
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= c.vocab:
            raise ValueError(f"token ids must be in [0, {c.vocab})")
        positions = np.arange(state.pos, state.pos + tokens.numel())
        h = self.W("model.embed_tokens.weight")[tokens]
        for i in range(c.layers):
            h = self.layer(h, i, positions, state)
        state.pos += tokens.numel()
        hn = rms(h, self.W("model.norm.weight"), c.eps)
        return hn @ self.W("lm_head.weight").T, hn

    def mtp(self, state, hidden, next_tokens, depth=0):
        """MTP rows state.mtp_pos ..: row p combines the main model's final-normed hidden h_p
        with the embedding of token t_{p+1}; returns (draft logits for t_{p+2} [T, V], the
        pre-norm output hidden fed to a further depth) (FAMILY §MTP)."""
        c = self.cfg
        if depth >= c.nextn:
            raise ValueError(f"this model has {c.nextn} MTP layers")
        i = c.layers + depth
        p = f"model.layers.{i}."
        toks = torch.as_tensor(next_tokens, dtype=torch.long)
        positions = np.arange(state.mtp_pos, state.mtp_pos + toks.numel())
        e = rms(self.W(p + "embed_tokens.weight")[toks], self.W(p + "enorm.weight"), c.eps)
        hh = rms(hidden, self.W(p + "hnorm.weight"), c.eps)
        x = torch.cat([e, hh], dim=-1) @ self.W(p + "eh_proj.weight").T
        x = self.layer(x, i, positions, state)
        state.mtp_pos += toks.numel()
        out = rms(x, self.W(p + "shared_head.norm.weight"), c.eps)
        return out @ self.W(p + "shared_head.head.weight").T, x


def load(model_dir, absorbed=False):
    cfg = Config.from_dir(model_dir)
    return DeepseekV3(cfg, load_weights(cfg, st.read_checkpoint(model_dir)), absorbed)


# ---------------------------------------------------------------- pass modes and goldens


def run_mode(model, tokens, mode):
    """All positions' logits [T, V] through one pass mode: 'prefill', 'decode' or 'split:K'."""
    state = State(model.cfg)
    if mode == "prefill":
        return model.forward(state, tokens)[0]
    if mode == "decode":
        return torch.cat([model.forward(state, [t])[0] for t in tokens])
    if mode.startswith("split:"):
        k = int(mode[6:])
        if not 0 < k < len(tokens):
            raise ValueError(f"split point {k} must be inside 1..{len(tokens) - 1}")
        return torch.cat([model.forward(state, tokens[:k])[0], model.forward(state, tokens[k:])[0]])
    raise ValueError(f"unknown mode {mode!r}")


def mtp_rows(model, tokens, mode="prefill"):
    """Draft logits of MTP depth 0 for rows 0..T-2 (row p predicts token p+2), computed from the
    main model's hidden of the same pass; 'decode' runs both one row at a time."""
    state = State(model.cfg)
    if mode == "prefill":
        _, hn = model.forward(state, tokens)
        return model.mtp(state, hn[:-1], tokens[1:])[0]
    rows = []
    _, hn = model.forward(state, tokens[:1])
    for t in range(1, len(tokens)):
        rows.append(model.mtp(state, hn, tokens[t : t + 1])[0])
        _, hn = model.forward(state, tokens[t : t + 1])
    return torch.cat(rows)


def greedy(model, prompt, n):
    state = State(model.cfg)
    logits = model.forward(state, prompt)[0][-1]
    out, margin = [], float("inf")
    for _ in range(n):
        top = torch.sort(logits, descending=True).values
        margin = min(margin, float(top[0] - top[1]))
        nxt = int(topk_lower_id(logits.unsqueeze(0), 1)[0, 0])
        out.append(nxt)
        logits = model.forward(state, [nxt])[0][-1]
    return out, margin


def write_f32(path, t):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(t.detach().numpy().astype("<f4").tobytes())


def write_case(model, out_dir, model_rel, tokens, prompt, n_new):
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    logits = run_mode(model, tokens, "prefill")
    write_f32(os.path.join(out_dir, "logits.f32"), logits)
    cont, margin = greedy(model, prompt, n_new)
    case = {
        "model": model_rel,
        "tokens": list(tokens),
        "logits_file": "logits.f32",
        "logits_shape": list(logits.shape),
        "logits_dtype": "float32 little-endian, row-major [position, vocab]",
        "greedy_prompt": list(prompt),
        "greedy_continuation": cont,
        "greedy_min_margin": margin,
        "reference": "float64 evaluation of docs/FAMILY.md (DeepSeek-V3 and Kimi K2): exact FP8/INT4 "
        "dequantisation, MLA latent norms eps 1e-6, other norms rms_norm_eps, YaRN on interleaved pairs",
    }
    if model.cfg.nextn:
        mtp = mtp_rows(model, tokens)
        write_f32(os.path.join(out_dir, "mtp_logits.f32"), mtp)
        case["mtp_logits_file"] = "mtp_logits.f32"
        case["mtp_logits_shape"] = list(mtp.shape)
        case["mtp_rows"] = "row p: MTP layer 0 on (final-normed hidden of position p, embedding of tokens[p+1]) at RoPE position p; predicts tokens[p+2]"
    fd = os.open(os.path.join(out_dir, "case.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")
    return case


def parse_ids(s):
    try:
        return [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"token list {s!r}: expected comma-separated integers")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__ or "DeepSeek-V3 / Kimi K2 float64 reference")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("logits", help="logits of all positions through one pass mode")
    r.add_argument("model")
    r.add_argument("--tokens", required=True)
    r.add_argument("--mode", default="prefill")
    r.add_argument("--absorbed", action="store_true", help="absorbed MLA instead of expanded")
    r.add_argument("--out", required=True, help="float32 LE [T, V]")
    r.add_argument("--mtp-out", help="also MTP depth-0 draft logits [T-1, V]")
    c = sub.add_parser("case", help="write a golden case folder (logits.f32 + case.json)")
    c.add_argument("model")
    c.add_argument("out_dir")
    c.add_argument("--tokens", required=True)
    c.add_argument("--greedy-prompt", required=True)
    c.add_argument("--greedy-new", type=int, default=12)
    c.add_argument("--model-rel", default="model", help="the case's 'model' field")
    a = ap.parse_args(argv)
    model = load(a.model, absorbed=getattr(a, "absorbed", False))
    if a.cmd == "logits":
        toks = parse_ids(a.tokens)
        write_f32(a.out, run_mode(model, toks, a.mode))
        if a.mtp_out:
            write_f32(a.mtp_out, mtp_rows(model, toks))
    else:
        case = write_case(model, a.out_dir, a.model_rel, parse_ids(a.tokens), parse_ids(a.greedy_prompt), a.greedy_new)
        print(json.dumps({k: case[k] for k in ("logits_shape", "greedy_continuation", "greedy_min_margin")}))


if __name__ == "__main__":
    main()
