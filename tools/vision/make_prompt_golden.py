#!/usr/bin/python3
# Writes the golden logits of a prompt with two images (docs/VISION.md §6): the golden tiny text
# model (tests/data/k3-tiny-bf16) with the tiny tower (tests/data/k3-tiny-vision) — the float64
# vision reference (k3_vision_ref.py) gives each image's projector rows, which replace the
# <|media_pad|> rows of the float64 PyTorch text model (tools/train/k3.py, the engine's
# independent second implementation) — so `deltafin logits --image` is checked against a
# reference that shares no code with the engine (tests/vision_tower_test.cpp).
#
# Why it is built this way: the two references already exist and are each proven against the
# engine's goldens (selfcheck.py; tools/train/check_golden.py), so this file only joins them the
# way §6 states; the prompt is the C++ test's (ids spelled out here and there: the tiny
# tokenizer's specials sit at vocab - 256 + the release offsets 18..21). It also checks that the
# text model alone reproduces the text golden's logits before writing anything.
#
# Usage: make_prompt_golden.py [--repo DIR]   (Debian's /usr/bin/python3; a few seconds)
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "train"))
import k3  # noqa: E402
import k3_vision_pre as pre  # noqa: E402
import k3_vision_ref as ref  # noqa: E402

FIRST_SPECIAL = 512 - 256
BEGIN, CONTENT, END, PAD = (FIRST_SPECIAL + o for o in (18, 19, 20, 21))
IMAGES = ["la_gray.png", "tiny_20x9.png"]  # 4 and 1 tokens


def segment(n):
    return [BEGIN, 105, 109, 97, 103, 101, CONTENT] + [PAD] * n + [END]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo", default=os.path.join(HERE, "..", ".."))
    a = ap.parse_args()
    torch.set_num_threads(2)
    data = os.path.join(a.repo, "tests", "data")
    text_dir = os.path.join(data, "k3-tiny-bf16")
    model = k3.load(os.path.join(text_dir, "model"), torch.float64, chunk=7)
    case = json.load(open(os.path.join(text_dir, "case.json")))
    with torch.no_grad():
        got = model(torch.tensor([case["tokens"]]))[0]
    want = np.fromfile(os.path.join(text_dir, case["logits_file"]), dtype="<f4").reshape(case["logits_shape"])
    err = float((got - torch.from_numpy(want.astype(np.float64))).abs().max())
    assert err < 1e-4, f"the text reference disagrees with the text golden: {err}"

    vision_model = os.path.join(data, "k3-tiny-vision", "model")
    vcfg, _ = ref.load_vision_config(vision_model)
    W = ref.read_vision_tensors(vision_model, vcfg.expected_tensors())
    cfg = pre.validate_media_proc_cfg(pre.RELEASE_MEDIA_PROC_CFG, "release")
    rows, counts = [], []
    for name in IMAGES:
        frs = pre.open_frames(os.path.join(data, "vision", name))
        pix, grid, plan, _ = pre.preprocess_frames(frs, cfg, "pil")
        with torch.no_grad():
            out = ref.forward(torch.from_numpy(pix.astype(np.float64)), [grid], W, vcfg, "bilinear",
                              ref.DEFAULT_VIT_NORM_EPS)
        rows.append(out)
        counts.append(int(out.shape[0]))
    ids = [5, 17, 200] + segment(counts[0]) + [42] + segment(counts[1]) + [7, 300, 64]
    pads = [i for i, t in enumerate(ids) if t == PAD]
    assert len(pads) == sum(counts)
    with torch.no_grad():
        h0 = model.w("model.embed_tokens.weight")[torch.tensor([ids])].clone()
        h0[0, pads] = torch.cat(rows, dim=0)
        logits = model(torch.tensor([ids]), h0=h0)[0]
    exp_dir = os.path.join(data, "k3-tiny-vision", "expected")
    path = os.path.join(exp_dir, "prompt_two_images.f32")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(logits.numpy().astype("<f4").tobytes())
    meta = {"note": "written by tools/vision/make_prompt_golden.py: float64 text model (tools/train/k3.py) "
                    "over tests/data/k3-tiny-bf16 with the float64 tower's rows (k3_vision_ref.py) in place "
                    "of the <|media_pad|> rows; logits float32 LE [tokens, vocab]",
            "images": ["vision/" + n for n in IMAGES], "image_tokens": counts, "tokens": ids,
            "media_placeholder_token_id": PAD, "file": "prompt_two_images.f32",
            "shape": list(logits.shape)}
    fd = os.open(os.path.join(exp_dir, "prompt_two_images.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{len(ids)} tokens, image tokens {counts}; text reference vs golden {err:.2e}")


if __name__ == "__main__":
    main()
