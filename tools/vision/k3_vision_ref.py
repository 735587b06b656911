#!/usr/bin/python3
# An independent float64 reference of Kimi K3's vision path: the checkpoint processor's
# preprocessing (k3_vision_pre.py) and the MoonViT3d tower + PatchMergerMLPV2 projector, written
# from docs/VISION.md (section numbers below are that file's) and sharing no code with the engine
# or with any public port. Debian's python3 only (python3-torch 1.13, python3-pil, numpy).
#
# Why it is built this way:
# - float64 everywhere after the float32 pixel tensor, from the BF16 weights converted exactly,
#   so it states the ideal math an exact float32 engine is compared with (as the text model's
#   golden data is made), not the rounding of one GPU kernel.
# - Every operation is written out (patch embedding as a matrix product over the documented patch
#   vector layout, interpolation with the documented source-index and kernel formulas, RoPE as
#   explicit cos/sin on the documented dimension pairs, attention per image in query blocks), so
#   the code reads as the doc does; selfcheck.py compares it with a float32 execution written the
#   other way (conv2d, F.interpolate, complex multiplication).
# - The two open questions of the doc (§4.3 the position-embedding interpolation mode, §5 the
#   encoder RMSNorm epsilon) are flags, so the lead can measure both answers.
# - The checkpoint is read tensor by tensor (seek + read of only the 168 vision tensors), so the
#   real 96-shard release can be read without loading whole shards.
#
# Usage (run from anywhere; MODEL is a folder in the release layout):
#   k3_vision_ref.py run MODEL IMAGE --out PREFIX [options]
#       writes PREFIX.f32 (float32 little-endian [tokens, text_hidden]) and PREFIX.json (grid,
#       token count, prompt pieces, options); --dump DIR also writes the pixel tensor and every
#       intermediate (manifest.json lists names, shapes; each NAME.f32 is float32 LE row-major).
#   k3_vision_ref.py preprocess IMAGE [--model MODEL | --preprocessor-config FILE] [--dump DIR]
#       prints the plan, grid and token count (the release media_proc_cfg when neither is given).
#   Options of run: --pos-interp {config,bilinear,bicubic} (default config: the vision_config
#   field), --vit-norm-eps X (default 2^-23, §5), --resize {pil,exact} (default pil, what the
#   reference does; exact is the integer re-implementation), --frames N (first N frames of an
#   animation as one multi-frame input; the released processor always uses N = 1),
#   --threads N (torch CPU threads, default 2).
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_vision_pre as pre  # noqa: E402
from k3_vision_pre import InputError  # noqa: E402

VISION_PREFIXES = ("vision_tower.", "mm_projector.")
DEFAULT_VIT_NORM_EPS = 2.0 ** -23  # torch.finfo(torch.float32).eps, §5

# §2.1: vision_config fields, their defaults when absent (the KimiK3VisionConfig defaults of the
# public ports), and the values this implementation supports.
VISION_DEFAULTS = {
    "patch_size": 14,
    "init_pos_emb_height": 64,
    "init_pos_emb_width": 64,
    "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "pos_emb_interpolation_mode": "bilinear",
    "vt_num_attention_heads": 12,
    "vt_num_hidden_layers": 27,
    "vt_hidden_size": 1024,
    "vt_intermediate_size": 4096,
    "qkv_hidden_size": 1536,
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmergerv2",
    "mm_hidden_size": None,
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5,
    "norm_type": "rmsnorm",
    "attn_bias": False,
    "linear_bias": False,
    "patch_embed_proj_bias": False,
    "mlp_type": "mlp2",
    "activation_func": "gelu_pytorch_tanh",
    "text_hidden_size": 7168,
}
FIXED_VALUES = {
    "pos_emb_type": ("divided_fixed",),
    "merge_type": ("sd2_tpool",),
    "mm_projector_type": ("patchmergerv2",),
    "projector_hidden_act": ("gelu",),
    "norm_type": ("rmsnorm",),
    "mlp_type": ("mlp2",),
    "activation_func": ("gelu_pytorch_tanh", "gelu"),
    "pos_emb_interpolation_mode": ("bilinear", "bicubic"),
}


class VisionConfig:
    def __init__(self, vc, text_hidden=None, where="config.json"):
        if not isinstance(vc, dict):
            raise InputError(f"{where}: vision_config must be an object")
        c = dict(VISION_DEFAULTS)
        c.update({k: v for k, v in vc.items() if k in VISION_DEFAULTS})
        for k, allowed in FIXED_VALUES.items():
            if c[k] not in allowed:
                raise InputError(f"{where}: vision_config.{k} = {c[k]!r}; this implementation supports {list(allowed)}")
        for k in ("attn_bias", "linear_bias", "patch_embed_proj_bias"):
            if not isinstance(c[k], bool):
                raise InputError(f"{where}: vision_config.{k} must be true or false")

        def posint(k, hi):
            v = c[k]
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise InputError(f"{where}: vision_config.{k} must be an integer in [1, {hi}], got {v!r}")
            return v

        self.patch = posint("patch_size", 64)
        self.pos_h = posint("init_pos_emb_height", 1024)
        self.pos_w = posint("init_pos_emb_width", 1024)
        self.pos_t = posint("init_pos_emb_time", 64)
        self.heads = posint("vt_num_attention_heads", 256)
        self.layers = posint("vt_num_hidden_layers", 256)
        self.hidden = posint("vt_hidden_size", 65536)
        self.inter = posint("vt_intermediate_size", 1 << 20)
        self.qkv = posint("qkv_hidden_size", 65536)
        self.text_hidden = posint("text_hidden_size", 1 << 20)
        if c["mm_hidden_size"] is None:
            c["mm_hidden_size"] = self.hidden
        self.mm_hidden = posint("mm_hidden_size", 65536)
        mk = c["merge_kernel_size"]
        if not (isinstance(mk, list) and len(mk) == 2 and all(isinstance(v, int) and 1 <= v <= 8 for v in mk)):
            raise InputError(f"{where}: vision_config.merge_kernel_size must be [kh, kw] with 1..8, got {mk!r}")
        self.merge = tuple(mk)
        if self.qkv % self.heads or (self.qkv // self.heads) % 4:
            raise InputError(f"{where}: qkv_hidden_size {self.qkv} must split into {self.heads} heads of a multiple of 4")
        if self.hidden % 2:
            raise InputError(f"{where}: vt_hidden_size must be even (the time embedding is sin|cos halves)")
        if self.mm_hidden != self.hidden:
            raise InputError(f"{where}: mm_hidden_size {self.mm_hidden} must equal vt_hidden_size {self.hidden}")
        eps = c["projector_ln_eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise InputError(f"{where}: projector_ln_eps must be in (0, 1), got {eps!r}")
        self.proj_eps = float(eps)
        if text_hidden is not None and text_hidden != self.text_hidden:
            raise InputError(f"{where}: vision_config.text_hidden_size {self.text_hidden} != text_config.hidden_size {text_hidden}")
        self.head_dim = self.qkv // self.heads
        self.raw = c

    def expected_tensors(self):
        """§4.1: every vision tensor name and shape the config implies (all BF16 in the release)."""
        D, P, Q, I = self.hidden, self.patch, self.qkv, self.inter
        t = {"vision_tower.patch_embed.proj.weight": (D, 3, P, P),
             "vision_tower.patch_embed.pos_emb.weight": (self.pos_h, self.pos_w, D),
             "vision_tower.encoder.final_layernorm.weight": (D,)}
        if self.raw["patch_embed_proj_bias"]:
            t["vision_tower.patch_embed.proj.bias"] = (D,)
        for i in range(self.layers):
            b = f"vision_tower.encoder.blocks.{i}."
            t[b + "norm0.weight"] = (D,)
            t[b + "norm1.weight"] = (D,)
            t[b + "wqkv.weight"] = (3 * Q, D)
            t[b + "wo.weight"] = (D, Q)
            t[b + "mlp.fc0.weight"] = (I, D)
            t[b + "mlp.fc1.weight"] = (D, I)
            if self.raw["attn_bias"]:
                t[b + "wqkv.bias"] = (3 * Q,)
                t[b + "wo.bias"] = (D,)
            if self.raw["linear_bias"]:
                t[b + "mlp.fc0.bias"] = (I,)
                t[b + "mlp.fc1.bias"] = (D,)
        M = self.mm_hidden * self.merge[0] * self.merge[1]
        t["mm_projector.proj.0.weight"] = (M, M)
        t["mm_projector.proj.2.weight"] = (self.text_hidden, M)
        t["mm_projector.post_norm.weight"] = (self.text_hidden,)
        return t


def load_vision_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(1 << 22))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read a JSON model config ({e})")
    if not isinstance(doc, dict) or not isinstance(doc.get("vision_config"), dict):
        raise InputError(f"{path}: expected an object with a vision_config object")
    tc = doc.get("text_config")
    th = tc.get("hidden_size") if isinstance(tc, dict) else None
    return VisionConfig(doc["vision_config"], th, path), doc


# ---------------------------------------------------------------- checkpoint (§4.1)

DTYPES = {"BF16": 2, "F16": 2, "F32": 4}


def _decode(raw, dt, shape):
    if dt == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        a = u.view(np.float32)
    elif dt == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    else:
        a = np.frombuffer(raw, dtype="<f4")
    return torch.from_numpy(a.astype(np.float64)).reshape(shape)


def read_vision_tensors(model_dir, expected):
    """Reads exactly the expected vision tensors from the release layout; checks every header."""
    ipath = os.path.join(model_dir, "model.safetensors.index.json")
    try:
        with open(ipath, "rb") as f:
            index = json.loads(f.read(1 << 28))
        wmap = index["weight_map"]
        if not isinstance(wmap, dict):
            raise ValueError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{ipath}: cannot read the shard index ({e})")
    extra = sorted(n for n in wmap if n.startswith(VISION_PREFIXES) and n not in expected)
    missing = sorted(n for n in expected if n not in wmap)
    if extra or missing:
        raise InputError(f"{ipath}: vision tensors differ from the config: missing {missing[:8]}, unexpected {extra[:8]}")
    by_shard = {}
    for n in expected:
        s = wmap[n]
        if not isinstance(s, str) or "/" in s or "\\" in s or s.startswith(".") or not s.endswith(".safetensors"):
            raise InputError(f"{ipath}: tensor {n} points at an unacceptable shard name {s!r}")
        by_shard.setdefault(s, []).append(n)
    out = {}
    for shard, names in sorted(by_shard.items()):
        path = os.path.join(model_dir, shard)
        try:
            fsize = os.path.getsize(path)
            with open(path, "rb") as f:
                hl = struct.unpack("<Q", f.read(8))[0]
                if hl > min(fsize - 8, 1 << 30):
                    raise InputError(f"{path}: header length {hl} exceeds the file")
                header = json.loads(f.read(hl))
                base = 8 + hl
                for n in names:
                    meta = header.get(n)
                    if not isinstance(meta, dict):
                        raise InputError(f"{path}: the index lists {n} here but the shard header lacks it")
                    dt, shape, offs = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
                    if dt not in DTYPES:
                        raise InputError(f"{path}: {n} has dtype {dt!r}; expected BF16 (or F32/F16)")
                    if list(shape) != list(expected[n]):
                        raise InputError(f"{path}: {n} has shape {shape}, the config implies {list(expected[n])}")
                    a, b = offs
                    want = DTYPES[dt] * math.prod(shape)
                    if not (isinstance(a, int) and isinstance(b, int) and 0 <= a <= b and b - a == want and base + b <= fsize):
                        raise InputError(f"{path}: {n} data offsets {offs} do not hold {want} bytes inside the file")
                    f.seek(base + a)
                    out[n] = _decode(f.read(want), dt, tuple(shape))
        except InputError:
            raise
        except (OSError, ValueError, struct.error, TypeError) as e:
            raise InputError(f"{path}: cannot read the shard ({e})")
    return out


# ---------------------------------------------------------------- math pieces (§4)


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _cubic_weights(t, A=-0.75):
    def c1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def c2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    return (c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t))


def interp_matrix(in_size, out_size, mode):
    """[out, in] float64 matrix of torch's interpolate (align_corners=False, no antialias), §4.3."""
    m = torch.zeros(out_size, in_size, dtype=torch.float64)
    scale = in_size / out_size
    for o in range(out_size):
        src = (o + 0.5) * scale - 0.5
        if mode == "bilinear":
            src = max(src, 0.0)
            i0 = int(math.floor(src))
            i1 = i0 + 1 if i0 < in_size - 1 else i0
            l1 = src - i0
            m[o, i0] += 1.0 - l1
            m[o, i1] += l1
        else:
            i = int(math.floor(src))
            t = src - i
            for j, wgt in enumerate(_cubic_weights(t)):
                m[o, min(max(i - 1 + j, 0), in_size - 1)] += wgt
    return m


def pos_embedding_2d(weight, h, w, mode):
    """[pos_h, pos_w, D] -> [h*w, D], rows of the patch grid in row-major order."""
    ph, pw, d = weight.shape
    if (h, w) == (ph, pw):
        return weight.reshape(ph * pw, d)
    my = interp_matrix(ph, h, mode)
    mx = interp_matrix(pw, w, mode)
    out = torch.einsum("yi,ijd,xj->yxd", my, weight, mx)
    return out.reshape(h * w, d)


def time_embedding(d, t):
    """[t, d]: sin of position * omega_i in the first d/2 dims, cos in the last d/2, §4.4."""
    omega = 1.0 / 10000.0 ** (torch.arange(d // 2, dtype=torch.float64) / (d / 2.0))
    ang = torch.arange(t, dtype=torch.float64)[:, None] * omega[None, :]
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=1)


def rope_angles(h, w, head_dim, theta=10000.0):
    """[h*w, head_dim/2] angles of each rotated pair j (dims 2j, 2j+1), §4.6."""
    j = torch.arange(head_dim // 2)
    freq = 1.0 / theta ** ((4 * (j // 2)).double() / head_dim)
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64).repeat(h)
    coord = torch.where((j % 2 == 0)[None, :], cols[:, None], rows[:, None])
    return coord * freq[None, :]


def rotate(x, ang):
    """x [n, heads, head_dim]; rotate pairs (2j, 2j+1) by ang [n, head_dim/2]."""
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def attention(q, k, v, block=512):
    """Full non-causal attention of one image; q,k,v [n, heads, hd] -> [n, heads*hd]."""
    n, heads, hd = q.shape
    out = torch.empty(n, heads, hd, dtype=q.dtype)
    kt = k.permute(1, 2, 0)
    vv = v.permute(1, 0, 2)
    for s in range(0, n, block):
        e = min(n, s + block)
        sc = torch.matmul(q[s:e].permute(1, 0, 2), kt) / math.sqrt(hd)
        sc = sc - sc.amax(-1, keepdim=True)
        p = torch.exp(sc)
        p = p / p.sum(-1, keepdim=True)
        out[s:e] = torch.matmul(p, vv).permute(1, 0, 2)
    return out.reshape(n, heads * hd)


def linear(x, W, prefix, name):
    y = x @ W[prefix + name + ".weight"].T
    b = W.get(prefix + name + ".bias")
    return y + b if b is not None else y


# ---------------------------------------------------------------- tower + projector (§4)


def forward(pixels, grids, W, cfg, pos_interp, vit_eps, dump=None):
    """pixels float64 [sum t*h*w, 3, p, p], grids [(t, h, w)] -> [tokens, text_hidden] float64."""
    dump = dump if dump is not None else (lambda name, t: None)
    D, P = cfg.hidden, cfg.patch
    n = pixels.shape[0]
    if n != sum(t * h * w for t, h, w in grids):
        raise InputError("pixel rows do not match the grids")
    x = pixels.reshape(n, 3 * P * P) @ W["vision_tower.patch_embed.proj.weight"].reshape(D, 3 * P * P).T
    if "vision_tower.patch_embed.proj.bias" in W:
        x = x + W["vision_tower.patch_embed.proj.bias"]
    dump("patch_embed", x)
    pos, angles, spans = [], [], []
    start = 0
    for t, h, w in grids:
        if t > cfg.pos_t:
            raise InputError(f"{t} frames, over init_pos_emb_time {cfg.pos_t}")
        if h % cfg.merge[0] or w % cfg.merge[1]:
            raise InputError(f"grid {h}x{w} is not a multiple of the merge kernel {cfg.merge}")
        if not (1 <= h <= 512 and 1 <= w <= 512):
            raise InputError(f"grid {h}x{w} is outside the 512x512 RoPE table of the reference")
        p2 = pos_embedding_2d(W["vision_tower.patch_embed.pos_emb.weight"], h, w, pos_interp)
        if t > 1:
            p2 = (p2[None, :, :] + time_embedding(D, t)[:, None, :]).reshape(t * h * w, D)
        pos.append(p2)
        angles.append(rope_angles(h, w, cfg.head_dim).repeat(t, 1))
        spans.append((start, start + t * h * w))
        start += t * h * w
    x = x + torch.cat(pos)
    ang = torch.cat(angles)
    dump("embed", x)
    H, hd, Q = cfg.heads, cfg.head_dim, cfg.qkv
    act = gelu_tanh if cfg.raw["activation_func"] == "gelu_pytorch_tanh" else gelu_erf
    for i in range(cfg.layers):
        b = f"vision_tower.encoder.blocks.{i}."
        y = rms_norm(x, W[b + "norm0.weight"], vit_eps)
        qkv = linear(y, W, b, "wqkv")
        q = rotate(qkv[:, :Q].reshape(n, H, hd), ang)
        k = rotate(qkv[:, Q:2 * Q].reshape(n, H, hd), ang)
        v = qkv[:, 2 * Q:].reshape(n, H, hd)
        o = torch.cat([attention(q[s:e], k[s:e], v[s:e]) for s, e in spans])
        x = x + linear(o, W, b, "wo")
        y = rms_norm(x, W[b + "norm1.weight"], vit_eps)
        x = x + linear(act(linear(y, W, b, "mlp.fc0")), W, b, "mlp.fc1")
        dump(f"block{i}", x)
    x = rms_norm(x, W["vision_tower.encoder.final_layernorm.weight"], vit_eps)
    dump("final_norm", x)
    kh, kw = cfg.merge
    merged = []
    for (t, h, w), (s, e) in zip(grids, spans):
        g = x[s:e].reshape(t, h // kh, kh, w // kw, kw, D).permute(0, 1, 3, 2, 4, 5).mean(0)
        merged.append(g.reshape((h // kh) * (w // kw), kh * kw * D))
    z = torch.cat(merged)
    dump("merged", z)
    z = gelu_erf(z @ W["mm_projector.proj.0.weight"].T)
    z = z @ W["mm_projector.proj.2.weight"].T
    dump("projector_pre_norm", z)
    return rms_norm(z, W["mm_projector.post_norm.weight"], cfg.proj_eps)


# ---------------------------------------------------------------- files


def _open_private(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb")


def write_f32(path, t):
    with _open_private(path) as f:
        f.write(np.ascontiguousarray(t.detach().double().numpy().astype("<f4")).tobytes())


def write_json(path, obj):
    with _open_private(path) as f:
        f.write((json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


class Dumper:
    def __init__(self, folder):
        self.folder = folder
        self.items = []
        if folder:
            os.makedirs(folder, mode=0o700, exist_ok=True)

    def __call__(self, name, t):
        if not self.folder:
            return
        write_f32(os.path.join(self.folder, name + ".f32"), t)
        self.items.append({"name": name, "shape": list(t.shape), "file": name + ".f32"})

    def finish(self, extra):
        if self.folder:
            write_json(os.path.join(self.folder, "manifest.json"), dict(extra, tensors=self.items))


def prepare(image_path, mcfg, frames, resize_impl, dumper):
    frs = pre.open_frames(image_path, frames)
    pix, grid, plan, u8 = pre.preprocess_frames(frs, mcfg, resize_impl)
    if dumper.folder:
        write_f32(os.path.join(dumper.folder, "pixel_values.f32"), torch.from_numpy(pix.astype(np.float64)))
        dumper.items.append({"name": "pixel_values", "shape": list(pix.shape), "file": "pixel_values.f32"})
        with _open_private(os.path.join(dumper.folder, "pixels_u8.rgb")) as f:
            f.write(u8.tobytes())
        dumper.items.append({"name": "pixels_u8", "shape": list(u8.shape), "file": "pixels_u8.rgb", "dtype": "u8"})
    info = {"image": os.path.basename(image_path), "mode": frs[0].mode, "frames": frames,
            "plan": plan, "grid_thw": list(grid), "num_tokens": plan["num_tokens"],
            "patches": int(pix.shape[0]), "resize": resize_impl,
            "prompt_prefix": f"<|media_begin|>image {plan['width']}x{plan['height']}<|media_content|>",
            "prompt_pad": "<|media_pad|>", "prompt_suffix": "<|media_end|>"}
    return pix, grid, info


def cmd_run(a):
    cfg, _ = load_vision_config(a.model)
    mcfg = pre.load_media_proc_cfg(a.model)
    if mcfg["patch_size"] != cfg.patch or mcfg["merge_kernel_size"] != cfg.merge[0] or cfg.merge[0] != cfg.merge[1]:
        raise InputError("preprocessor patch/merge sizes disagree with vision_config")
    W = read_vision_tensors(a.model, cfg.expected_tensors())
    dumper = Dumper(a.dump)
    pix, grid, info = prepare(a.image, mcfg, a.frames, a.resize, dumper)
    mode = cfg.raw["pos_emb_interpolation_mode"] if a.pos_interp == "config" else a.pos_interp
    with torch.no_grad():
        out = forward(torch.from_numpy(pix.astype(np.float64)), [grid], W, cfg, mode, a.vit_norm_eps, dumper)
    write_f32(a.out + ".f32", out)
    info.update({"tokens": int(out.shape[0]), "hidden": int(out.shape[1]), "dtype": "float32 little-endian",
                 "pos_interp": mode, "vit_norm_eps": a.vit_norm_eps, "projector_eps": cfg.proj_eps,
                 "layers": cfg.layers})
    write_json(a.out + ".json", info)
    dumper.finish(info)
    print(json.dumps({k: info[k] for k in ("image", "grid_thw", "num_tokens", "hidden", "pos_interp")}))


def cmd_preprocess(a):
    if a.model:
        mcfg = pre.load_media_proc_cfg(a.model)
    elif a.preprocessor_config:
        with open(a.preprocessor_config, "rb") as f:
            mcfg = pre.validate_media_proc_cfg(json.loads(f.read(1 << 20))["media_proc_cfg"], a.preprocessor_config)
    else:
        mcfg = pre.validate_media_proc_cfg(pre.RELEASE_MEDIA_PROC_CFG, "release media_proc_cfg")
    dumper = Dumper(a.dump)
    _, _, info = prepare(a.image, mcfg, a.frames, a.resize, dumper)
    dumper.finish(info)
    print(json.dumps(info, sort_keys=True))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Kimi K3 vision float64 reference (docs/VISION.md)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="preprocess IMAGE and run tower + projector of MODEL")
    r.add_argument("model")
    r.add_argument("image")
    r.add_argument("--out", required=True, help="output prefix: PREFIX.f32 and PREFIX.json")
    r.add_argument("--pos-interp", choices=("config", "bilinear", "bicubic"), default="config")
    r.add_argument("--vit-norm-eps", type=float, default=DEFAULT_VIT_NORM_EPS)
    for p in (r, sub.add_parser("preprocess", help="preprocessing only: plan, grid, tokens")):
        p.add_argument("--resize", choices=("pil", "exact"), default="pil")
        p.add_argument("--frames", type=int, default=1)
        p.add_argument("--dump", help="folder for the pixel tensor and intermediates")
        p.add_argument("--threads", type=int, default=2)
    pp = sub.choices["preprocess"]
    pp.add_argument("image")
    pp.add_argument("--model")
    pp.add_argument("--preprocessor-config")
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, a.threads))
    try:
        (cmd_run if a.cmd == "run" else cmd_preprocess)(a)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
