#!/usr/bin/python3
# Writes the engine's vision goldens from the float64 reference (docs/VISION.md §8), so the C++
# tests (tests/vision_*_test.cpp), which cannot run Python, compare against committed files:
#
#   tests/data/vision/decode/           small images of every PNG/GIF/JPEG/WebP variant the
#                                       decoders handle (bit depths, palettes, tRNS, interlacing,
#                                       grey-ramp GIFs, offset frames, progressive JPEG, WebP with
#                                       alpha and animation) plus more hostile files
#   tests/data/vision/preprocess.json   per image (test images and decode set): Pillow's mode and
#                                       size, the plan, SHA-256 of the reference's pixel tensor
#                                       (float32 LE) and of its padded uint8 image, sampled values
#   tests/data/k3-tiny-vision/          the tiny tower (make_tiny_vision.py, seed 1234) in the
#                                       release layout, and expected/: the projector rows the
#                                       float64 reference gives for each test image (all rows up to
#                                       128 tokens, else 64 evenly spaced rows), a two-frame input
#                                       with its pixels, a bicubic-position case, and the
#                                       eps 2^-23 vs 2^-7 measurement (docs/VISION.md §5)
#
# Why it is built this way: every expected value is what the reference processor (Pillow) and the
# float64 tower compute; the images are drawn from formulas (no external data) and the hand-made
# PNG/GIF encoders below exist because Pillow cannot write interlaced PNGs, 16-bit samples with
# tRNS, short palettes or offset GIF frames. Deterministic: the same run gives the same bytes.
#
# Usage: make_engine_goldens.py [--repo DIR]   (run with Debian's /usr/bin/python3; ~1 minute)
import argparse
import hashlib
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k3_vision_pre as pre  # noqa: E402
import k3_vision_ref as ref  # noqa: E402
import make_tiny_vision  # noqa: E402

GOOD = ["anim.gif", "image.webp", "la_gray.png", "photo.jpg", "portrait_palette.png", "rgba_wide.png",
        "tiny_20x9.png", "wide_resized.png"]


def sha(b):
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------- hand-made encoders


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def pack_row(samples, bit_depth):
    """samples: 1-D ints (one per sample) -> packed bytes of one PNG row (big-endian for 16)."""
    if bit_depth == 16:
        return b"".join(struct.pack(">H", int(v)) for v in samples)
    if bit_depth == 8:
        return bytes(int(v) for v in samples)
    per = 8 // bit_depth
    out = bytearray()
    for i in range(0, len(samples), per):
        b = 0
        for j in range(per):
            v = int(samples[i + j]) if i + j < len(samples) else 0
            b |= v << (8 - bit_depth * (j + 1))
        out.append(b)
    return bytes(out)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def png_bytes(arr, bit_depth, color_type, extra=b"", interlace=False):
    """arr [h, w, c] ints -> PNG (filter 0) with `extra` chunks before IDAT."""
    h, w, c = arr.shape
    raw = bytearray()
    if not interlace:
        for y in range(h):
            raw += b"\x00" + pack_row(arr[y].reshape(-1), bit_depth)
    else:
        for x0, y0, dx, dy in ADAM7:
            sub = arr[y0::dy, x0::dx]
            if sub.shape[0] == 0 or sub.shape[1] == 0:
                continue
            for y in range(sub.shape[0]):
                raw += b"\x00" + pack_row(sub[y].reshape(-1), bit_depth)
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra + png_chunk(b"IDAT", zlib.compress(bytes(raw), 9))
            + png_chunk(b"IEND", b""))


def gif_lzw(indices, min_code):
    """LZW data that never grows the code width: a clear code before every 2^min_code - 2 literals."""
    clear, end = 1 << min_code, (1 << min_code) + 1
    width = min_code + 1
    codes = []
    run = (1 << min_code) - 2
    for i, v in enumerate(indices):
        if i % run == 0:
            codes.append(clear)
        codes.append(int(v))
    codes.append(end)
    bits, nbits, out = 0, 0, bytearray()
    for cde in codes:
        bits |= cde << nbits
        nbits += width
        while nbits >= 8:
            out.append(bits & 0xFF)
            bits >>= 8
            nbits -= 8
    if nbits:
        out.append(bits & 0xFF)
    blocks = bytearray([min_code])
    for i in range(0, len(out), 255):
        blk = out[i:i + 255]
        blocks += bytes([len(blk)]) + blk
    return bytes(blocks + b"\x00")


def gif_bytes(screen, global_pal, frames):
    """frames: dicts with idx [h, w], left, top, local_pal (or None), transparent (or None), interlace."""
    sw, sh = screen
    out = bytearray(b"GIF89a" + struct.pack("<HH", sw, sh))
    if global_pal is not None:
        bits = max(1, int(np.ceil(np.log2(len(global_pal) // 3))))
        pal = bytes(global_pal) + bytes(3 * (1 << bits) - len(global_pal))
        out += bytes([0x80 | 0x70 | (bits - 1), 0, 0]) + pal
    else:
        out += bytes([0x70, 0, 0])
    for f in frames:
        if f.get("transparent") is not None:
            out += b"\x21\xf9\x04" + bytes([0x05]) + struct.pack("<H", 10) + bytes([f["transparent"], 0])
        idx = f["idx"]
        h, w = idx.shape
        flags = 0x40 if f.get("interlace") else 0
        lp = f.get("local_pal")
        if lp is not None:
            bits = max(1, int(np.ceil(np.log2(len(lp) // 3))))
            flags |= 0x80 | (bits - 1)
        out += b"\x2c" + struct.pack("<HHHH", f["left"], f["top"], w, h) + bytes([flags])
        if lp is not None:
            out += bytes(lp) + bytes(3 * (1 << bits) - len(lp))
        rows = idx if not f.get("interlace") else np.concatenate(
            [idx[s::st] for s, st in ((0, 8), (4, 8), (2, 4), (1, 2))], axis=0)
        out += gif_lzw(rows.reshape(-1), max(2, f.get("min_code", 4)))
    out += b"\x3b"
    return bytes(out)


def pil_bytes(img, **kw):
    buf = io.BytesIO()
    img.save(buf, **kw)
    return buf.getvalue()


def decode_set():
    """name -> bytes of the decode-test images (good ones) and hostile ones."""
    rng = np.random.default_rng(38)
    yy, xx = np.mgrid[0:7, 0:13]
    good, hostile = {}, {}
    g = (xx * 19 + yy * 7) % 256
    good["png_gray1.png"] = png_bytes(((xx + yy) % 3 == 0)[:, :, None].astype(int), 1, 0)
    good["png_gray2_trns.png"] = png_bytes(((xx + 2 * yy) % 4)[:, :, None], 2, 0, png_chunk(b"tRNS", struct.pack(">H", 170)))
    good["png_gray4.png"] = png_bytes(((xx * 3 + yy) % 16)[:, :, None], 4, 0)
    good["png_gray8_trns.png"] = png_bytes(((xx * 40 + yy * 20) % 200)[:, :, None], 8, 0, png_chunk(b"tRNS", struct.pack(">H", 120)))
    rgb16 = np.stack([xx * 5000 + 17, yy * 9000 + 255, (xx * yy * 777) % 65536], axis=2)
    good["png_rgb16.png"] = png_bytes(rgb16, 16, 2)
    good["png_rgb_trns.png"] = png_bytes(np.stack([g, 255 - g, (g * 3) % 256], axis=2), 8, 2,
                                         png_chunk(b"tRNS", struct.pack(">HHH", g[0, 0], 255 - g[0, 0], (g[0, 0] * 3) % 256)))
    la16 = np.stack([xx * 4000 + yy * 300, np.clip(xx * 6000, 0, 65535)], axis=2)
    good["png_la16.png"] = png_bytes(la16, 16, 4)
    rgba16 = np.stack([xx * 5000, yy * 9000, 65535 - xx * 3000, (xx * 5461 + yy * 300) % 65536], axis=2)
    good["png_rgba16.png"] = png_bytes(rgba16, 16, 6)
    good["png_interlaced.png"] = png_bytes(np.stack([g, (g * 5) % 256, 255 - g], axis=2), 8, 2, interlace=True)
    good["png_interlaced_rgba.png"] = png_bytes(
        np.stack([g, (g * 5) % 256, 255 - g, (xx * 20 + yy * 30) % 256], axis=2), 8, 6, interlace=True)
    pal4 = bytes([200, 30, 30, 30, 200, 30, 30, 30, 200, 250, 250, 0])
    idx = (xx + yy * 2) % 11  # indices 4..10 lie past the 4-entry palette: grey in Pillow
    good["png_palette_short_trns.png"] = png_bytes(idx[:, :, None], 8, 3, png_chunk(b"PLTE", pal4) + png_chunk(b"tRNS", bytes([0, 128, 255])))
    good["png_palette1.png"] = png_bytes(((xx // 2 + yy) % 2)[:, :, None], 1, 3, png_chunk(b"PLTE", bytes([10, 20, 30, 240, 230, 220])))
    good["png_palette_simple_trns.png"] = png_bytes(((xx + yy) % 4)[:, :, None], 2, 3,
                                                    png_chunk(b"PLTE", pal4) + png_chunk(b"tRNS", bytes([255, 0, 255])))
    # Wide images that the rule resizes, one per resampling path not covered by the main set.
    wy, wx = np.mgrid[0:20, 0:7300]
    good["png_L_wide.png"] = png_bytes((((wx // 7) * 37 + wy * 11) % 256)[:, :, None], 8, 0)
    ly, lx = np.mgrid[0:12, 0:7200]
    good["png_LA_wide.png"] = png_bytes(np.stack([(lx * 3 + ly * 17) % 256, ((lx // 64) * 32) % 256], axis=2), 8, 4)
    oy, ox = np.mgrid[0:9, 0:7500]
    good["png_1_wide.png"] = png_bytes((((ox // 3) + oy) % 2)[:, :, None], 1, 0)
    # GIFs: grey-ramp palettes (mode L), an offset frame on a larger screen, interlacing, a local
    # palette over a global one, an index past the table.
    ramp = [v for i in range(16) for v in (i, i, i)]
    good["gif_grey_ramp.gif"] = gif_bytes((13, 7), ramp, [{"idx": (xx + yy) % 16, "left": 0, "top": 0, "transparent": 3}])
    colours = [255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 0, 10, 10, 10, 200, 200, 200, 90, 40, 160, 0, 128, 128]
    good["gif_offset.gif"] = gif_bytes((20, 12), colours, [{"idx": (xx + yy) % 8, "left": 4, "top": 3, "transparent": 5}])
    good["gif_offset_opaque.gif"] = gif_bytes((16, 10), colours, [{"idx": (xx * 2 + yy) % 8, "left": 2, "top": 1}])
    good["gif_interlaced.gif"] = gif_bytes((13, 7), colours, [{"idx": (xx + 3 * yy) % 8, "left": 0, "top": 0, "interlace": True}])
    good["gif_local_palette.gif"] = gif_bytes((13, 7), colours, [{"idx": (xx + yy) % 4, "left": 0, "top": 0,
                                                                  "local_pal": [5, 6, 7, 50, 60, 70, 150, 160, 170, 250, 240, 230]}])
    good["gif_local_ramp.gif"] = gif_bytes((13, 7), colours, [{"idx": (xx + yy) % 4, "left": 0, "top": 0,
                                                               "local_pal": [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]}])
    good["gif_local_ramp_only.gif"] = gif_bytes((13, 7), None, [{"idx": (xx + yy) % 4, "left": 0, "top": 0,
                                                                 "local_pal": [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]}])
    good["gif_past_table.gif"] = gif_bytes((13, 7), colours[:12], [{"idx": (xx + yy) % 9, "left": 0, "top": 0, "min_code": 4}])
    ph = make_photo(61, 45)
    good["jpeg_gray.jpg"] = pil_bytes(Image.fromarray(ph[:, :, 0]), format="JPEG", quality=85)
    good["jpeg_progressive.jpg"] = pil_bytes(Image.fromarray(ph), format="JPEG", quality=90, progressive=True)
    good["jpeg_444.jpg"] = pil_bytes(Image.fromarray(ph), format="JPEG", quality=95, subsampling=0)
    rgba = np.concatenate([ph, ((np.arange(61)[None, :] * 4 + np.arange(45)[:, None]) % 256).astype(np.uint8)[:, :, None]], axis=2)
    good["webp_alpha.webp"] = pil_bytes(Image.fromarray(rgba, "RGBA"), format="WEBP", lossless=True)
    good["webp_lossy_alpha.webp"] = pil_bytes(Image.fromarray(rgba, "RGBA"), format="WEBP", quality=70)
    f0, f1 = Image.fromarray(ph), Image.fromarray(ph[::-1].copy())
    good["webp_anim.webp"] = pil_bytes(f0, format="WEBP", save_all=True, append_images=[f1], duration=100, quality=80)
    # Hostile files beyond the main set's: each must be refused with one clear error.
    hostile["cmyk.jpg"] = pil_bytes(Image.fromarray(ph).convert("CMYK"), format="JPEG")
    hostile["gray16.png"] = png_bytes((xx * 4000)[:, :, None], 16, 0)
    jp = good["jpeg_progressive.jpg"]
    hostile["truncated.jpg"] = jp[: len(jp) // 2]
    hostile["bomb.gif"] = gif_bytes((30000, 30000), colours, [{"idx": (xx + yy) % 8, "left": 0, "top": 0}])
    hostile["bomb_frame.gif"] = gif_bytes((10, 10), colours, [{"idx": (xx + yy) % 8, "left": 20000, "top": 20000}])
    hostile["image.bmp"] = pil_bytes(Image.fromarray(ph), format="BMP")
    wp = good["webp_alpha.webp"]
    hostile["truncated.webp"] = wp[: len(wp) * 2 // 3]
    bad = bytearray(good["png_interlaced.png"])
    bad[40] ^= 0xFF  # the IDAT chunk's type: an unknown critical chunk, no image data
    hostile["bad_chunk.png"] = bytes(bad)
    bad = bytearray(good["png_interlaced.png"])
    bad[60] ^= 0xFF  # inside IDAT's compressed data
    hostile["bad_idat.png"] = bytes(bad)
    hostile["gif_no_image.gif"] = b"GIF89a" + struct.pack("<HH", 10, 10) + bytes([0, 0, 0]) + b"\x3b"
    hostile["webp_garbage.webp"] = b"RIFF" + struct.pack("<I", 200) + b"WEBPVP8 " + bytes(rng.integers(0, 256, 200, dtype=np.uint8))
    hostile["jpeg_huge.jpg"] = jpeg_with_size(pil_bytes(Image.fromarray(ph), format="JPEG"), 60000, 60000)
    return good, hostile


def jpeg_with_size(data, w, h):
    """The JPEG with its SOF0 frame header claiming w x h."""
    b = bytearray(data)
    i = b.find(b"\xff\xc0")
    b[i + 5:i + 9] = struct.pack(">HH", h, w)
    return bytes(b)


def make_photo(w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / 7.0) * np.cos(y / 9.0)
    g = 255 * x / w
    b = 255 * (1 - y / h)
    m = (x - w * 0.6) ** 2 + (y - h * 0.4) ** 2 < (h * 0.3) ** 2
    r, g, b = np.where(m, 240, r), np.where(m, 30, g), np.where(m, 50, b)
    return np.clip(np.stack([r, g, b], axis=2), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- reference runs


def write_private(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def preprocess_record(path, cfg):
    frs = pre.open_frames(path)
    pix, grid, plan, u8 = pre.preprocess_frames(frs, cfg, "pil")
    pix2, _, _, u82 = pre.preprocess_frames(frs, cfg, "exact")
    assert np.array_equal(u8, u82) and np.array_equal(pix.view(np.uint32), pix2.view(np.uint32)), path
    flat = pix.astype("<f4").reshape(-1)
    picks = np.unique(np.linspace(0, flat.size - 1, 48).astype(np.int64))
    im = frs[0]
    return pix, grid, {
        "mode": im.mode, "width": plan["width"], "height": plan["height"],
        "transparency": "transparency" in im.info,
        "rgb_sha256": sha(np.asarray(im.convert("RGB"), dtype=np.uint8).tobytes()),
        "resized": [plan["new_width"], plan["new_height"]],
        "grid_thw": list(grid), "num_tokens": plan["num_tokens"],
        "pixel_values_sha256": sha(flat.tobytes()),
        "padded_u8_sha256": sha(u8.tobytes()),
        "samples": [[int(i), float(flat[i])] for i in picks],
    }


def rows_to_keep(n):
    if n <= 128:
        return list(range(n))
    return sorted(set(np.linspace(0, n - 1, 64).astype(np.int64).tolist()))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo", default=os.path.join(HERE, "..", ".."))
    a = ap.parse_args()
    torch.set_num_threads(2)
    vision_dir = os.path.join(a.repo, "tests", "data", "vision")
    decode_dir = os.path.join(vision_dir, "decode")
    os.makedirs(decode_dir, exist_ok=True)
    good, hostile = decode_set()
    for name, data in list(good.items()) + list(hostile.items()):
        write_private(os.path.join(decode_dir, name), data)
    cfg = pre.validate_media_proc_cfg(pre.RELEASE_MEDIA_PROC_CFG, "release")

    records = {}
    for name in GOOD:
        _, _, records[name] = preprocess_record(os.path.join(vision_dir, name), cfg)
    for name in sorted(good):
        _, _, records["decode/" + name] = preprocess_record(os.path.join(decode_dir, name), cfg)
    refused = {}
    for name in sorted(hostile):
        try:
            frs = pre.open_frames(os.path.join(decode_dir, name))
            pre.preprocess_frames(frs, cfg, "pil")
            refused[name] = "accepted by the reference"
        except pre.InputError as e:
            refused[name] = str(e).split(": ", 1)[-1][:120]
    with open(os.path.join(vision_dir, "preprocess.json"), "w") as f:
        json.dump({"media_proc_cfg": "release", "note": "written by tools/vision/make_engine_goldens.py",
                   "images": records, "hostile": refused}, f, indent=1, sort_keys=True)
        f.write("\n")

    # The tiny tower and its projector rows.
    tiny = os.path.join(a.repo, "tests", "data", "k3-tiny-vision")
    model = os.path.join(tiny, "model")
    if not os.path.isdir(model):
        make_tiny_vision.make(model)
    vcfg, _ = ref.load_vision_config(model)
    W = ref.read_vision_tensors(model, vcfg.expected_tensors())
    exp_dir = os.path.join(tiny, "expected")
    os.makedirs(exp_dir, exist_ok=True)
    cases = {}
    eps_diff = 0.0
    for name in GOOD:
        pix, grid, rec = preprocess_record(os.path.join(vision_dir, name), cfg)
        with torch.no_grad():
            x = torch.from_numpy(pix.astype(np.float64))
            out = ref.forward(x, [grid], W, vcfg, "bilinear", ref.DEFAULT_VIT_NORM_EPS)
            out7 = ref.forward(x, [grid], W, vcfg, "bilinear", 2.0 ** -7)
        # Relative to the largest output magnitude (elements near zero make per-element ratios
        # meaningless).
        eps_diff = max(eps_diff, float((out7 - out).abs().max() / out.abs().max()))
        keep = rows_to_keep(out.shape[0])
        stem = os.path.splitext(name)[0]
        write_private(os.path.join(exp_dir, stem + ".f32"), out[keep].numpy().astype("<f4").tobytes())
        cases[name] = {"image": "vision/" + name, "grid_thw": list(grid), "tokens": int(out.shape[0]),
                       "hidden": int(out.shape[1]), "rows": keep, "file": stem + ".f32"}
    # Two frames of one size (the tower's temporal path): la_gray and its mirror image.
    frs = pre.open_frames(os.path.join(vision_dir, "la_gray.png"))
    mirror = frs[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    mirror.info = dict(frs[0].info)
    pix2, grid2, _, _ = pre.preprocess_frames([frs[0], mirror], cfg, "pil")
    with torch.no_grad():
        out2 = ref.forward(torch.from_numpy(pix2.astype(np.float64)), [grid2], W, vcfg, "bilinear", ref.DEFAULT_VIT_NORM_EPS)
    write_private(os.path.join(exp_dir, "two_frames_pixels.f32"), pix2.astype("<f4").tobytes())
    write_private(os.path.join(exp_dir, "two_frames.f32"), out2.numpy().astype("<f4").tobytes())
    cases["two_frames"] = {"pixels": "two_frames_pixels.f32", "grid_thw": list(grid2), "tokens": int(out2.shape[0]),
                           "hidden": int(out2.shape[1]), "rows": list(range(out2.shape[0])), "file": "two_frames.f32"}
    # The bicubic position-embedding interpolation (config switch) on one image.
    pix, grid, _ = preprocess_record(os.path.join(vision_dir, "photo.jpg"), cfg)
    with torch.no_grad():
        outb = ref.forward(torch.from_numpy(pix.astype(np.float64)), [grid], W, vcfg, "bicubic", ref.DEFAULT_VIT_NORM_EPS)
    keep = rows_to_keep(outb.shape[0])
    write_private(os.path.join(exp_dir, "photo_bicubic.f32"), outb[keep].numpy().astype("<f4").tobytes())
    cases["photo_bicubic"] = {"image": "vision/photo.jpg", "grid_thw": list(grid), "tokens": int(outb.shape[0]),
                              "hidden": int(outb.shape[1]), "rows": keep, "file": "photo_bicubic.f32",
                              "pos_emb_interpolation_mode": "bicubic"}
    with open(os.path.join(exp_dir, "expected.json"), "w") as f:
        json.dump({"reference": "tools/vision/k3_vision_ref.py forward(), float64, vit norm eps 2^-23, "
                                "projector eps 1e-5, bilinear unless stated; rows float32 LE [len(rows), hidden]",
                   "cases": cases,
                   "eps_2^-7_vs_2^-23_max_abs_difference_over_max_abs": eps_diff}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(records)} preprocessing records, {len(refused)} hostile, {len(cases)} tower cases; "
          f"eps 2^-7 vs 2^-23 max relative difference {eps_diff:.3e}")


if __name__ == "__main__":
    main()
