# Kimi K3 image preprocessing, as the released checkpoint's own processor does it, written from
# docs/VISION.md §3 (the section numbers below are that file's). It is a development tool run with
# Debian's python3 (numpy, python3-pil); the engine never runs it.
#
# Why it is built this way:
# - The reference processor resizes with Pillow (`Image.resize(..., BICUBIC)` on the decoded
#   8-bit image, alpha kept through the resize and composited afterwards). A C++ engine cannot
#   call Pillow, so besides calling Pillow (`resize_impl="pil"`, what the reference does) this
#   file carries a second, independent implementation of exactly what Pillow 9.4 computes
#   (`resize_impl="exact"`: fixed-point separable bicubic, premultiplied alpha, nearest for
#   palette images) in plain integer numpy. selfcheck.py proves the two bit-identical on every
#   test image, which is what makes §3.4 of the doc trustworthy enough to port.
# - Every number that reaches the tower passes through the same float32/float64 steps as the
#   reference (normalisation in float32 with float64 intermediates, §3.6), so the pixel tensor
#   this file writes is the reference's pixel tensor, bit for bit.
# - Images are hostile input: byte and pixel limits are checked before decoding, every failure
#   is turned into InputError naming the file and what was expected.
import io
import json
import math
import os

import numpy as np
from PIL import Image

# §2.2: the released preprocessor_config.json's media_proc_cfg.
RELEASE_MEDIA_PROC_CFG = {
    "in_patch_limit": 65536,
    "patch_size": 14,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_kernel_size": 2,
    "fixed_output_tokens": None,
    "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 16384,
    "sample_fps": 8.0,
    "temporal_merge_kernel_size": 4,
    "transparent_bg_config": {
        "pattern": "chessboard",
        "chessboard_square_size": 8,
        "chessboard_square_on_top_left": True,
        "chessboard_white_value": 255,
        "chessboard_gray_value": 180,
    },
    "transparent_bg_fill_stage": "after_resize",
    "config_type": "media_proc.processors.moonvit.MoonViTMediaProcessorConfig",
}

# The defaults of the reference's TransparentBgConfig dataclass (used for absent keys).
BG_DEFAULTS = {
    "pattern": "black",
    "chessboard_square_size": 16,
    "chessboard_square_on_top_left": True,
    "chessboard_white_value": 255,
    "chessboard_gray_value": 200,
}

# §3.1 limits. Pillow's own decompression-bomb rule (what the reference inherits): an image of
# more than 2 * Image.MAX_IMAGE_PIXELS (2 * 89,478,485) pixels is refused at open.
MAX_FILE_BYTES = 64 << 20
MAX_PIXELS = 2 * 89478485
MAX_FRAMES = 4  # init_pos_emb_time of the release; also the tower's bound


class InputError(Exception):
    """A bad image or config: the message names the file and what was expected."""


# ---------------------------------------------------------------- config (§2.2)


def _int_field(cfg, name, lo, hi, where):
    v = cfg.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InputError(f"{where}: media_proc_cfg.{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def validate_media_proc_cfg(raw, where="preprocessor_config.json"):
    if not isinstance(raw, dict):
        raise InputError(f"{where}: media_proc_cfg must be an object")
    cfg = dict(raw)
    _int_field(cfg, "patch_size", 1, 64, where)
    mk = cfg.get("merge_kernel_size")
    if isinstance(mk, list) and len(mk) == 2 and mk[0] == mk[1]:
        cfg["merge_kernel_size"] = mk = mk[0]
    _int_field(cfg, "merge_kernel_size", 1, 8, where)
    _int_field(cfg, "in_patch_limit", 1, 1 << 22, where)
    _int_field(cfg, "patch_limit_on_one_side", 1, 4096, where)
    if cfg.get("fixed_output_tokens") is not None:
        raise InputError(f"{where}: fixed_output_tokens must be null (the release value); got {cfg['fixed_output_tokens']!r}")
    for name in ("image_mean", "image_std"):
        v = cfg.get(name)
        if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise InputError(f"{where}: media_proc_cfg.{name} must be a list of 3 numbers, got {v!r}")
    if any(not (x > 0 and math.isfinite(x)) for x in cfg["image_std"]):
        raise InputError(f"{where}: media_proc_cfg.image_std must be positive, got {cfg['image_std']!r}")
    stage = cfg.get("transparent_bg_fill_stage", "before_resize")
    if stage not in ("before_resize", "after_resize"):
        raise InputError(f"{where}: transparent_bg_fill_stage must be before_resize or after_resize, got {stage!r}")
    cfg["transparent_bg_fill_stage"] = stage
    bg = cfg.get("transparent_bg_config")
    if bg is not None:
        if not isinstance(bg, dict) or set(bg) - set(BG_DEFAULTS):
            raise InputError(f"{where}: transparent_bg_config must be an object with keys from {sorted(BG_DEFAULTS)}")
        full = dict(BG_DEFAULTS)
        full.update(bg)
        if full["pattern"] not in ("white", "black", "gray", "chessboard"):
            raise InputError(f"{where}: transparent_bg_config.pattern must be white, black, gray or chessboard")
        _int_field(full, "chessboard_square_size", 1, 4096, where + " transparent_bg_config")
        _int_field(full, "chessboard_white_value", 0, 255, where + " transparent_bg_config")
        _int_field(full, "chessboard_gray_value", 0, 255, where + " transparent_bg_config")
        if not isinstance(full["chessboard_square_on_top_left"], bool):
            raise InputError(f"{where}: chessboard_square_on_top_left must be true or false")
        cfg["transparent_bg_config"] = full
    return cfg


def load_media_proc_cfg(model_dir):
    path = os.path.join(model_dir, "preprocessor_config.json")
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
        doc = json.loads(raw)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read a JSON preprocessor config ({e})")
    if not isinstance(doc, dict) or "media_proc_cfg" not in doc:
        raise InputError(f"{path}: expected an object with a media_proc_cfg member")
    return validate_media_proc_cfg(doc["media_proc_cfg"], path)


# ---------------------------------------------------------------- the resize rule (§3.3)


def navit_plan(width, height, cfg):
    """The reference's navit_resize_image, in the same float64 arithmetic."""
    p = cfg["patch_size"]
    m = cfg["merge_kernel_size"]
    side = cfg["patch_limit_on_one_side"]
    s1 = math.sqrt(cfg["in_patch_limit"] / (max(1.0, width // p) * max(1.0, height // p)))
    s2 = side * p / width
    s3 = side * p / height
    scale = min(1.0, s1, s2, s3)
    new_w = min(max(1, int(width * scale)), side * p)
    new_h = min(max(1, int(height * scale)), side * p)
    f = m * p
    pad_w = (f - new_w % f) % f
    pad_h = (f - new_h % f) % f
    tok_h = (new_h + pad_h) // f
    tok_w = (new_w + pad_w) // f
    if tok_h * m > side or tok_w * m > side:
        raise InputError(f"the resize rule left {tok_h * m}x{tok_w * m} patches, over patch_limit_on_one_side {side}")
    return {
        "width": width,
        "height": height,
        "scale": scale,
        "new_width": new_w,
        "new_height": new_h,
        "pad_width": pad_w,
        "pad_height": pad_h,
        "grid_h": (new_h + pad_h) // p,
        "grid_w": (new_w + pad_w) // p,
        "num_tokens": tok_h * tok_w,
    }


# ---------------------------------------------------------------- decoding (§3.1)


def open_frames(path, frames=1, max_bytes=MAX_FILE_BYTES, max_pixels=MAX_PIXELS):
    """Decode frame 0 (and the next frames-1 frames of an animation) as Pillow images."""
    if not 1 <= frames <= MAX_FRAMES:
        raise InputError(f"{path}: frames must be 1..{MAX_FRAMES}, got {frames}")
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise InputError(f"{path}: {size} bytes, over the {max_bytes}-byte image limit")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})")
    if not data:
        raise InputError(f"{path}: empty file; expected a PNG, JPEG, GIF or WebP image")
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels // 2  # Pillow refuses above twice this
    try:
        im = Image.open(io.BytesIO(data))
        w, h = im.size
        if w <= 0 or h <= 0:
            raise InputError(f"{path}: image is {w}x{h}; expected a positive width and height")
        if w * h > max_pixels:
            raise InputError(f"{path}: {w}x{h} = {w * h} pixels, over the {max_pixels}-pixel limit")
        out = []
        for i in range(frames):
            try:
                im.seek(i)
            except EOFError:
                raise InputError(f"{path}: asked for {frames} frames, the image has {i}")
            im.load()
            fr = im.copy()
            fr.info = dict(im.info)
            out.append(fr)
        return out
    except InputError:
        raise
    except Image.DecompressionBombError as e:
        raise InputError(f"{path}: refused as a decompression bomb ({e})")
    except Image.UnidentifiedImageError:
        raise InputError(f"{path}: not a recognised image (expected PNG, JPEG, GIF or WebP with a positive size)")
    except Exception as e:  # Pillow raises many types for malformed files
        raise InputError(f"{path}: not a decodable image ({type(e).__name__}: {e})")
    finally:
        Image.MAX_IMAGE_PIXELS = old


# ---------------------------------------------------------------- transparency (§3.2)


def chessboard(height, width, bg):
    sq = bg["chessboard_square_size"]
    ys = (np.arange(height) // sq)[:, None]
    xs = (np.arange(width) // sq)[None, :]
    gray_parity = 1 if bg["chessboard_square_on_top_left"] else 0
    board = np.where((ys + xs) % 2 == gray_parity, bg["chessboard_gray_value"], bg["chessboard_white_value"])
    return np.repeat(board.astype(np.uint8)[:, :, None], 3, axis=2)


def to_rgb(image, bg):
    """The reference's fill_transparent_bg_with: RGB uint8 array [h, w, 3]."""
    if bg is None or image.mode == "RGB":
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
    has_alpha = "A" in image.getbands() or "transparency" in image.info
    if not has_alpha:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
    rgba = np.asarray(image.convert("RGBA"), dtype=np.uint8)
    h, w = rgba.shape[:2]
    pattern = bg["pattern"]
    if pattern == "chessboard":
        back = chessboard(h, w, bg)
    else:
        back = np.full((h, w, 3), {"white": 255, "black": 0, "gray": 128}[pattern], dtype=np.uint8)
    a = rgba[:, :, 3].astype(np.float32) / np.float32(255.0)
    a3 = np.stack([a] * 3, axis=2)
    # float32 throughout, truncated to uint8: the reference's exact steps (§3.2).
    mixed = a3 * rgba[:, :, :3] + (np.float32(1.0) - a3) * back
    return mixed.astype(np.uint8)


# ---------------------------------------------------------------- Pillow's resize, exactly (§3.4)

PRECISION_BITS = 22


def _bicubic(x):
    a = -0.5
    if x < 0.0:
        x = -x
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def pil_coeffs(in_size, out_size):
    """Pillow's precompute_coeffs + normalize_coeffs_8bpc for BICUBIC (support 2)."""
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    starts = np.zeros(out_size, dtype=np.int64)
    counts = np.zeros(out_size, dtype=np.int64)
    coeffs = np.zeros((out_size, ksize), dtype=np.int64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = int(center - support + 0.5)  # C (int): truncation toward zero
        if xmin < 0:
            xmin = 0
        xmax = int(center + support + 0.5)
        if xmax > in_size:
            xmax = in_size
        xmax -= xmin
        k = [_bicubic((x + xmin - center + 0.5) * ss) for x in range(xmax)]
        ww = 0.0
        for v in k:
            ww += v
        if ww != 0.0:
            k = [v / ww for v in k]
        for x, v in enumerate(k):
            coeffs[xx, x] = int(-0.5 + v * (1 << PRECISION_BITS)) if v < 0 else int(0.5 + v * (1 << PRECISION_BITS))
        starts[xx] = xmin
        counts[xx] = xmax
    return starts, counts, coeffs


def _clip8(acc):
    return np.where(acc >= (1 << (PRECISION_BITS + 8)), 255, np.where(acc <= 0, 0, acc >> PRECISION_BITS)).astype(np.uint8)


def _pass(img, in_size, out_size, axis):
    """One separable pass over axis (1 = columns/horizontal, 0 = rows/vertical); img int64 [h, w, c]."""
    starts, counts, coeffs = pil_coeffs(in_size, out_size)
    ksize = coeffs.shape[1]
    idx = starts[:, None] + np.arange(ksize)[None, :]
    valid = np.arange(ksize)[None, :] < counts[:, None]
    idx = np.where(valid, np.minimum(idx, in_size - 1), 0)
    coeffs = np.where(valid, coeffs, 0)
    acc = np.full((img.shape[0], out_size, img.shape[2]) if axis == 1 else (out_size, img.shape[1], img.shape[2]),
                  1 << (PRECISION_BITS - 1), dtype=np.int64)
    for j in range(ksize):
        if axis == 1:
            acc += img[:, idx[:, j], :] * coeffs[None, :, j, None]
        else:
            acc += img[idx[:, j], :, :] * coeffs[:, j, None, None]
    return _clip8(acc)


def resample_bicubic_u8(arr, new_w, new_h):
    """Pillow's ImagingResample (BICUBIC, 8 bits per band): horizontal pass first, uint8 between."""
    h, w = arr.shape[:2]
    out = arr
    if new_w != w:
        out = _pass(out.astype(np.int64), w, new_w, 1)
    if new_h != h:
        out = _pass(out.astype(np.int64), h, new_h, 0)
    return out


def _muldiv255(a, b):
    t = a.astype(np.int64) * b.astype(np.int64) + 128
    return (((t >> 8) + t) >> 8).astype(np.uint8)


def resample_nearest(arr, new_w, new_h):
    """Pillow's NEAREST resize (ImagingScaleAffine): source index = (int) of a running double sum."""
    h, w = arr.shape[:2]

    def table(in_size, out_size):
        a = float(in_size) / out_size
        pos = 0.0 + a * 0.5
        out = np.zeros(out_size, dtype=np.int64)
        for i in range(out_size):
            out[i] = min(int(pos), in_size - 1) if pos >= 0 else 0
            pos += a
        return out

    return arr[table(h, new_h)][:, table(w, new_w)]


def resize_exact(image, new_w, new_h):
    """What Pillow 9.4's image.resize((new_w, new_h), BICUBIC) returns, as (mode, uint8 array)."""
    mode = image.mode
    if image.size == (new_w, new_h):
        return image.copy()
    if mode in ("1", "P"):
        arr = np.asarray(image.convert("L") if mode == "1" else image, dtype=np.uint8)
        out = np.ascontiguousarray(resample_nearest(arr, new_w, new_h))
        if mode == "1":
            res = Image.fromarray(out, "L").convert("1")
        else:
            res = Image.frombytes("P", (new_w, new_h), out.tobytes())
            res.putpalette(image.getpalette(rawmode="RGBA") or image.getpalette(), rawmode="RGBA" if image.getpalette(rawmode="RGBA") else "RGB")
        res.info = dict(image.info)
        return res
    if mode in ("L", "RGB", "CMYK"):
        arr = np.asarray(image, dtype=np.uint8)
        arr3 = arr[:, :, None] if arr.ndim == 2 else arr
        out = resample_bicubic_u8(arr3, new_w, new_h)
        res = Image.fromarray(out[:, :, 0] if arr.ndim == 2 else out, mode)
        res.info = dict(image.info)
        return res
    if mode in ("RGBA", "LA"):
        arr = np.asarray(image, dtype=np.uint8)
        alpha = arr[:, :, -1:]
        pre = np.concatenate([_muldiv255(arr[:, :, :-1], alpha), alpha], axis=2)
        out = resample_bicubic_u8(pre, new_w, new_h).astype(np.int64)
        a = out[:, :, -1:]
        safe = np.where((a == 0) | (a == 255), 1, a)
        un = np.where((a == 0) | (a == 255), out[:, :, :-1], np.minimum(255, (255 * out[:, :, :-1]) // safe))
        res = Image.fromarray(np.concatenate([un, a], axis=2).astype(np.uint8), mode)
        res.info = dict(image.info)
        return res
    raise InputError(f"image mode {mode} is outside what the exact resize covers (1, P, L, LA, RGB, RGBA, CMYK)")


def resize(image, new_w, new_h, impl):
    if impl == "pil":
        return image.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    if impl == "exact":
        return resize_exact(image, new_w, new_h)
    raise ValueError(f"unknown resize implementation {impl!r}")


# ---------------------------------------------------------------- the whole pipeline (§3.5–3.7)


def normalize(u8, cfg):
    """The reference's normalize(): float32 array, float64 mean / 1/std applied in place."""
    x = (u8 / 255.0).astype(np.float32)
    x -= np.array(cfg["image_mean"])
    x *= 1.0 / np.array(cfg["image_std"])
    return x


def patchify(pixels, p):
    """[T, H, W, 3] -> [T*(H/p)*(W/p), 3, p, p] (patches row-major, each channel-major) and grid."""
    t, h, w, c = pixels.shape
    x = pixels.reshape(t, h // p, p, w // p, p, c).transpose(0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(x.reshape(-1, c, p, p)), (t, h // p, w // p)


def preprocess_frames(frames, cfg, resize_impl="pil"):
    """Frames (Pillow images of one size) -> (pixel_values float32 [n, 3, p, p], grid, plan, u8)."""
    bg = cfg.get("transparent_bg_config")
    stage = cfg["transparent_bg_fill_stage"]
    w, h = frames[0].size
    plan = navit_plan(w, h, cfg)
    padded = []
    for fr in frames:
        if fr.size != (w, h):
            raise InputError(f"frames differ in size: {fr.size} vs {(w, h)}")
        if stage == "before_resize":
            fr = Image.fromarray(to_rgb(fr, bg), "RGB")
        fr = resize(fr, plan["new_width"], plan["new_height"], resize_impl)
        rgb = to_rgb(fr, bg) if stage == "after_resize" else np.asarray(fr.convert("RGB"), dtype=np.uint8)
        padded.append(np.pad(rgb, ((0, plan["pad_height"]), (0, plan["pad_width"]), (0, 0)), mode="constant"))
    u8 = np.stack(padded, axis=0)
    pixels, grid = patchify(normalize(u8, cfg), cfg["patch_size"])
    return pixels, grid, plan, u8


def image_prompt(width, height, num_tokens):
    """§6: the text the K3 renderer and processor put in the prompt for one image."""
    return f"<|media_begin|>image {width}x{height}<|media_content|>" + "<|media_pad|>" * num_tokens + "<|media_end|>"
