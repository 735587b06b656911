#!/usr/bin/python3
# Self-check of the K3 vision reference (k3_vision_pre.py, k3_vision_ref.py) on the test images of
# tests/data/vision and a tiny random tower (make_tiny_vision.py). Prints one line per check and a
# closing "N passed, N failed"; exits non-zero on any failure.
#
# Why it is built this way: a reference is only worth citing if a second computation written
# differently agrees with it, so the float64 tower is compared with a float32 one built from other
# primitives (conv2d over the padded image instead of a matrix product over patch vectors,
# F.interpolate instead of the doc's interpolation matrices, complex multiplication instead of
# cos/sin pairs, one softmax over the whole image instead of query blocks, explicit 2x2 gathers
# instead of the merger's reshape/permute). A layout mistake in either (patch vector order, which
# head dims follow the row, merge order, wqkv split) would show as an O(1) difference, not 1e-6.
# Pillow's resize is checked against the integer re-implementation bit for bit on every image.
#
# Usage: selfcheck.py [--keep DIR] [--threads N]
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k3_vision_pre as pre  # noqa: E402
import k3_vision_ref as ref  # noqa: E402
import make_tiny_vision  # noqa: E402

DATA = os.path.join(HERE, "..", "..", "tests", "data", "vision")
GOOD = ["anim.gif", "image.webp", "la_gray.png", "photo.jpg", "portrait_palette.png", "rgba_wide.png",
        "tiny_20x9.png", "wide_resized.png"]
HOSTILE = ["hostile_bomb.png", "hostile_empty.png", "hostile_garbage.jpg", "hostile_not_image.png",
           "hostile_truncated.png", "hostile_zero_width.png"]

results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")


# ---------------------------------------------------------------- the float32 second opinion


def tower_f32(u8, grid, W, cfg, mode, eps):
    """u8 [t, H, W, 3] padded pixels -> [tokens, text_hidden] float32, built from other primitives."""
    t, hh, ww, _ = u8.shape
    P, D = cfg.patch, cfg.hidden
    mean = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float32).view(1, 3, 1, 1)
    img = torch.from_numpy(u8.astype(np.float32)).permute(0, 3, 1, 2) / 255.0
    img = (img - mean) / 0.5
    w32 = {k: v.float() for k, v in W.items()}
    x = F.conv2d(img, w32["vision_tower.patch_embed.proj.weight"], stride=P)  # [t, D, gh, gw]
    gh, gw = x.shape[2], x.shape[3]
    assert (t, gh, gw) == tuple(grid)
    pos = w32["vision_tower.patch_embed.pos_emb.weight"].permute(2, 0, 1)[None]
    if (gh, gw) != tuple(pos.shape[2:]):
        pos = F.interpolate(pos, size=(gh, gw), mode=mode, align_corners=False)
    x = x + pos
    if t > 1:
        half = D // 2
        om = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) / half))
        te = np.concatenate([np.sin(np.arange(t)[:, None] * om), np.cos(np.arange(t)[:, None] * om)], axis=1)
        x = x + torch.from_numpy(te.astype(np.float32))[:, :, None, None]
    x = x.permute(0, 2, 3, 1).reshape(t * gh * gw, D)  # frame, row, column order
    n, H, hd = x.shape[0], cfg.heads, cfg.head_dim
    fr = 1.0 / (10000.0 ** (torch.arange(0, hd, 4, dtype=torch.float32) / hd))
    rr, cc = torch.meshgrid(torch.arange(gh, dtype=torch.float32), torch.arange(gw, dtype=torch.float32), indexing="ij")
    xc = torch.polar(torch.ones(gh * gw, hd // 4), cc.reshape(-1, 1) * fr)
    yc = torch.polar(torch.ones(gh * gw, hd // 4), rr.reshape(-1, 1) * fr)
    cis = torch.stack([xc, yc], dim=-1).reshape(gh * gw, hd // 2).repeat(t, 1)[:, None, :]

    def norm(v, wt, e):
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + e) * wt

    for i in range(cfg.layers):
        b = f"vision_tower.encoder.blocks.{i}."
        qkv = F.linear(norm(x, w32[b + "norm0.weight"], eps), w32[b + "wqkv.weight"]).view(n, 3, H, hd)
        q = torch.view_as_real(torch.view_as_complex(qkv[:, 0].reshape(n, H, hd // 2, 2).contiguous()) * cis).reshape(n, H, hd)
        k = torch.view_as_real(torch.view_as_complex(qkv[:, 1].reshape(n, H, hd // 2, 2).contiguous()) * cis).reshape(n, H, hd)
        v = qkv[:, 2]
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd), dim=-1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(n, H * hd)
        x = x + F.linear(o, w32[b + "wo.weight"])
        y = norm(x, w32[b + "norm1.weight"], eps)
        act = F.gelu(F.linear(y, w32[b + "mlp.fc0.weight"]), approximate="tanh")
        x = x + F.linear(act, w32[b + "mlp.fc1.weight"])
    x = norm(x, w32["vision_tower.encoder.final_layernorm.weight"], eps).view(t, gh, gw, D).mean(0)
    toks = []
    for r in range(gh // 2):
        for c in range(gw // 2):
            toks.append(torch.cat([x[2 * r, 2 * c], x[2 * r, 2 * c + 1], x[2 * r + 1, 2 * c], x[2 * r + 1, 2 * c + 1]]))
    z = torch.stack(toks)
    z = F.linear(F.gelu(F.linear(z, w32["mm_projector.proj.0.weight"])), w32["mm_projector.proj.2.weight"])
    return norm(z, w32["mm_projector.post_norm.weight"], cfg.proj_eps)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="keep the tiny model and outputs in this folder")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    work = a.keep or tempfile.mkdtemp(prefix="k3vision-")
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "tiny-vision")
    make_tiny_vision.make(model)
    cfg, _ = ref.load_vision_config(model)
    W = ref.read_vision_tensors(model, cfg.expected_tensors())
    mcfg = pre.load_media_proc_cfg(model)
    expected = json.load(open(os.path.join(DATA, "expected.json")))["images"]

    # interpolation matrices against torch's own interpolate (float64)
    wpos = W["vision_tower.patch_embed.pos_emb.weight"]
    for mode in ("bilinear", "bicubic"):
        worst = 0.0
        for (h, w) in ((2, 512), (4, 4), (50, 10), (63, 64), (64, 65), (100, 3), (1, 1)):
            mine = ref.pos_embedding_2d(wpos, h, w, mode)
            theirs = F.interpolate(wpos.permute(2, 0, 1)[None], size=(h, w), mode=mode, align_corners=False)[0]
            worst = max(worst, rel(mine, theirs.permute(1, 2, 0).reshape(h * w, -1)))
        check(f"interp {mode} formula == F.interpolate (float64)", worst < 1e-13, f"max rel {worst:.2e}")

    for name in GOOD:
        path = os.path.join(DATA, name)
        frs = pre.open_frames(path)
        pix_p, grid_p, plan, u8_p = pre.preprocess_frames(frs, mcfg, "pil")
        pix_e, grid_e, _, u8_e = pre.preprocess_frames(frs, mcfg, "exact")
        check(f"{name}: exact resize == Pillow", np.array_equal(pix_p, pix_e) and np.array_equal(u8_p, u8_e),
              f"{frs[0].mode} {frs[0].size} -> {plan['new_width']}x{plan['new_height']}")
        e = expected[name]
        check(f"{name}: grid and tokens == expected.json", list(grid_p) == e["grid_thw"] and plan["num_tokens"] == e["num_tokens"],
              f"grid {list(grid_p)} tokens {plan['num_tokens']}")
        unf = F.unfold(torch.from_numpy(pre.normalize(u8_p, mcfg)).permute(0, 3, 1, 2), kernel_size=14, stride=14)
        check(f"{name}: patch vector layout == unfold", torch.equal(unf[0].T, torch.from_numpy(pix_p.reshape(pix_p.shape[0], -1))))
        out = os.path.join(work, name.replace(".", "_"))
        r = subprocess.run([sys.executable, os.path.join(HERE, "k3_vision_ref.py"), "run", model, path, "--out", out,
                            "--threads", str(a.threads)], capture_output=True, text=True)
        if r.returncode != 0:
            check(f"{name}: reference run", False, r.stderr.strip())
            continue
        got = torch.from_numpy(np.fromfile(out + ".f32", dtype="<f4").astype(np.float64))
        meta = json.load(open(out + ".json"))
        got = got.reshape(meta["tokens"], meta["hidden"])
        check(f"{name}: output shape", tuple(got.shape) == (plan["num_tokens"], cfg.text_hidden), f"{tuple(got.shape)}")
        second = tower_f32(u8_p, grid_p, W, cfg, "bilinear", ref.DEFAULT_VIT_NORM_EPS)
        err = rel(second, got)
        check(f"{name}: float64 reference == float32 second implementation", err < 5e-5, f"max rel {err:.2e}")

    # several frames: time embedding and temporal pooling (not reachable from the released processor)
    frs = pre.open_frames(os.path.join(DATA, "anim.gif"), frames=2)
    pix, grid, plan, u8 = pre.preprocess_frames(frs, mcfg, "pil")
    with torch.no_grad():
        f64 = ref.forward(torch.from_numpy(pix.astype(np.float64)), [grid], W, cfg, "bilinear", ref.DEFAULT_VIT_NORM_EPS)
    err = rel(tower_f32(u8, grid, W, cfg, "bilinear", ref.DEFAULT_VIT_NORM_EPS), f64)
    check("anim.gif 2 frames: float64 == float32 (time embedding, temporal mean)", err < 5e-5 and grid[0] == 2, f"grid {list(grid)} max rel {err:.2e}")

    # bicubic position interpolation and the other epsilon, on one image
    frs = pre.open_frames(os.path.join(DATA, "photo.jpg"))
    pix, grid, plan, u8 = pre.preprocess_frames(frs, mcfg, "pil")
    with torch.no_grad():
        f64 = ref.forward(torch.from_numpy(pix.astype(np.float64)), [grid], W, cfg, "bicubic", 2.0 ** -7)
    err = rel(tower_f32(u8, grid, W, cfg, "bicubic", 2.0 ** -7), f64)
    check("photo.jpg bicubic + eps 2^-7: float64 == float32", err < 5e-5, f"max rel {err:.2e}")

    # two images in one call attend only within themselves
    frs2 = pre.open_frames(os.path.join(DATA, "tiny_20x9.png"))
    pix2, grid2, _, _ = pre.preprocess_frames(frs2, mcfg, "pil")
    with torch.no_grad():
        both = ref.forward(torch.from_numpy(np.concatenate([pix, pix2]).astype(np.float64)), [grid, grid2], W, cfg, "bilinear", 1e-6)
        one = ref.forward(torch.from_numpy(pix.astype(np.float64)), [grid], W, cfg, "bilinear", 1e-6)
        two = ref.forward(torch.from_numpy(pix2.astype(np.float64)), [grid2], W, cfg, "bilinear", 1e-6)
    check("two images in one call == each alone", rel(both, torch.cat([one, two])) < 1e-13)

    for name in HOSTILE:
        r = subprocess.run([sys.executable, os.path.join(HERE, "k3_vision_ref.py"), "run", model, os.path.join(DATA, name),
                            "--out", os.path.join(work, "hostile")], capture_output=True, text=True)
        check(f"{name}: refused with a clear error", r.returncode == 2 and r.stderr.startswith("error: ") and name in r.stderr,
              r.stderr.strip()[:140])

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
