#!/usr/bin/python3
# Makes the vision test images in tests/data/vision/ (all of our own making, drawn with numpy +
# Pillow from fixed formulas and a fixed seed) and expected.json, the release preprocessing plan
# of each good image (docs/VISION.md §3) as the reference processor computes it.
#
# Why these images: each one exercises a distinct branch of the preprocessing the engine must
# reproduce exactly, while staying a few KB (patterns that PNG/GIF filters compress well):
# - wide_resized.png 15000x40 RGB: over the one-side limit (15000 > 512*14), so the processor
#   resizes it by ~0.48 with Pillow's bicubic (support widened by the downscale factor);
# - rgba_wide.png 7500x40 RGBA: resized through Pillow's premultiplied-alpha path, then composited
#   on the chessboard (fill stage after_resize);
# - anim.gif 9000x24, 2 frames, palette with a transparent index: frame 0 is what is used; palette
#   images are resized with nearest neighbour, then composited;
# - tiny_20x9.png: smaller than one 28x28 merge cell (1 token);
# - la_gray.png 45x33 LA: grey + alpha, no resize; photo.jpg 640x427 (4:2:0 JPEG);
#   image.webp 333x250 (lossy WebP); portrait_palette.png 120x700 (palette, no transparency).
# - hostile_*: a truncated PNG, an empty file, a PNG whose IHDR says width 0, a tiny PNG whose IHDR
#   claims 30000x30000 (a decompression bomb), text named .png, and a JPEG start marker followed
#   by garbage. The reference refuses each with a clear error (selfcheck.py checks that).
#
# Usage: make_test_images.py [OUT_DIR]   (default: tests/data/vision beside this repository)
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_vision_pre as pre  # noqa: E402

MAX_BYTES = 50 * 1024


def wide_rgb(w, h):
    x = np.arange(w)[None, :]
    y = np.arange(h)[:, None]
    r = (x * 255 // (w - 1)) + 0 * y
    g = np.where((x // 97) % 2 == 0, 40, 200) + 0 * y
    b = np.where(y < h // 2, 30, 220) + 0 * x
    b = np.where((x % 1000) < 8, 255 - b, b)
    return np.stack([r, g, b], axis=2).astype(np.uint8)


def photo(w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / 37.0) * np.cos(y / 53.0)
    g = 255 * x / w
    b = 255 * (1 - y / h)
    for cx, cy, rad, col in ((200, 150, 80, (250, 30, 30)), (450, 300, 110, (20, 220, 60)), (520, 90, 40, (30, 30, 240))):
        m = (x - cx) ** 2 + (y - cy) ** 2 < rad ** 2
        r, g, b = np.where(m, col[0], r), np.where(m, col[1], g), np.where(m, col[2], b)
    return np.clip(np.stack([r, g, b], axis=2), 0, 255).astype(np.uint8)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(width, height, color_type, rows):
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(rows, 9))
            + png_chunk(b"IEND", b""))


def save(img, path, **kw):
    buf = io.BytesIO()
    img.save(buf, **kw)
    return write(path, buf.getvalue())


def write(path, data):
    if len(data) > MAX_BYTES:
        raise SystemExit(f"{path}: {len(data)} bytes, over the {MAX_BYTES}-byte budget for test images")
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "data", "vision")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20260801)
    sizes = {}
    p = lambda n: os.path.join(out, n)  # noqa: E731

    sizes["wide_resized.png"] = save(Image.fromarray(wide_rgb(15000, 40)), p("wide_resized.png"), format="PNG", optimize=True)

    rgba = np.concatenate([wide_rgb(7500, 40), np.zeros((40, 7500, 1), np.uint8)], axis=2)
    xs = np.arange(7500)
    alpha = (xs * 255 // 7499).astype(np.uint8)
    alpha = np.where((xs // 700) % 3 == 0, 0, alpha)
    alpha = np.where((xs // 700) % 3 == 1, 255, alpha)
    rgba[:, :, 3] = alpha[None, :]
    rgba[:20, :, 3] = np.where(rgba[:20, :, 3] > 0, 128, 0)
    sizes["rgba_wide.png"] = save(Image.fromarray(rgba, "RGBA"), p("rgba_wide.png"), format="PNG", optimize=True)

    pal = [0, 0, 0, 255, 255, 255, 230, 40, 40, 40, 200, 60, 30, 60, 230, 250, 200, 0] + [0] * (768 - 18)
    frames = []
    for k in range(2):
        x = np.arange(9000)[None, :]
        y = np.arange(24)[:, None]
        idx = ((x // (150 + 50 * k)) + (y // 6)) % 6
        idx = np.where((x // 1000) % 4 == 3, 0, idx).astype(np.uint8)
        f = Image.frombytes("P", (9000, 24), idx.tobytes())
        f.putpalette(pal)
        frames.append(f)
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0,
                   transparency=0, disposal=2)
    sizes["anim.gif"] = write(p("anim.gif"), buf.getvalue())

    sizes["tiny_20x9.png"] = save(Image.fromarray(rng.integers(0, 256, (9, 20, 3), dtype=np.uint8)), p("tiny_20x9.png"), format="PNG")

    yy, xx = np.mgrid[0:33, 0:45]
    la = np.stack([(xx * 5 + yy * 3) % 256, np.clip(xx * 6, 0, 255)], axis=2).astype(np.uint8)
    la[5:12, 30:40, 1] = 0
    sizes["la_gray.png"] = save(Image.fromarray(la, "LA"), p("la_gray.png"), format="PNG")

    sizes["photo.jpg"] = save(Image.fromarray(photo(640, 427)), p("photo.jpg"), format="JPEG", quality=80)
    sizes["image.webp"] = save(Image.fromarray(photo(333, 250)), p("image.webp"), format="WEBP", quality=75)

    yy, xx = np.mgrid[0:700, 0:120]
    idx = ((yy // 35) * 3 + (xx // 40)) % 5
    im = Image.frombytes("P", (120, 700), idx.astype(np.uint8).tobytes())
    im.putpalette(pal)
    sizes["portrait_palette.png"] = save(im, p("portrait_palette.png"), format="PNG", optimize=True)

    # hostile files
    good = open(p("photo.jpg"), "rb").read()
    full_png = open(p("portrait_palette.png"), "rb").read()
    sizes["hostile_truncated.png"] = write(p("hostile_truncated.png"), full_png[: len(full_png) * 6 // 10])
    sizes["hostile_empty.png"] = write(p("hostile_empty.png"), b"")
    sizes["hostile_zero_width.png"] = write(p("hostile_zero_width.png"), raw_png(0, 10, 0, b""))
    bomb_rows = b"".join(b"\x00" + bytes(30000) for _ in range(2))  # two zero rows; the rest is absent
    sizes["hostile_bomb.png"] = write(p("hostile_bomb.png"), raw_png(30000, 30000, 0, bomb_rows))
    sizes["hostile_not_image.png"] = write(p("hostile_not_image.png"), b"This is a text file, not a picture.\n" * 3)
    sizes["hostile_garbage.jpg"] = write(p("hostile_garbage.jpg"), b"\xff\xd8\xff\xe0" + bytes(rng.integers(0, 256, 600, dtype=np.uint8)))
    del good

    cfg = pre.validate_media_proc_cfg(pre.RELEASE_MEDIA_PROC_CFG, "release")
    expected = {}
    for name in sorted(sizes):
        if name.startswith("hostile_"):
            continue
        frs = pre.open_frames(p(name))
        plan = pre.navit_plan(frs[0].size[0], frs[0].size[1], cfg)
        expected[name] = {"mode": frs[0].mode, "width": plan["width"], "height": plan["height"],
                          "resized": [plan["new_width"], plan["new_height"]],
                          "padded": [plan["new_width"] + plan["pad_width"], plan["new_height"] + plan["pad_height"]],
                          "grid_thw": [1, plan["grid_h"], plan["grid_w"]], "num_tokens": plan["num_tokens"]}
    with open(p("expected.json"), "w") as f:
        json.dump({"media_proc_cfg": "release (tools/vision/k3_vision_pre.py RELEASE_MEDIA_PROC_CFG)",
                   "images": expected}, f, indent=1, sort_keys=True)
        f.write("\n")
    for name in sorted(sizes):
        print(f"{name:26s} {sizes[name]:6d} bytes  {json.dumps(expected.get(name, 'hostile'))}")


if __name__ == "__main__":
    main()
