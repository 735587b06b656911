#!/usr/bin/python3
# Packs an exported checkpoint folder (config.json, index, shards, tiktoken.model,
# tokenizer_config.json) into assets/demo/k3-demo.tar.gz, the archive the deltafin binary embeds
# as its built-in demo (src/cli/demo.cpp). The archive is deterministic (sorted names, zero
# mtimes and owners, gzip without a timestamp) so the same checkpoint always gives the same
# bytes, and it carries demo.json whose "about" text is the notice users see. With --draft, the
# demo's drafter folder (config.json + model.safetensors, the released layout; tools/train/
# train_eagle.py) goes in as draft/, which run/chat/serve/bench use by default on the demo, and
# --drafter's sentence about it goes into demo.json as "drafter" (shown only when a command
# drafts with it, not under --draft none or ngram).
# With --vision DIR (a `deltafin make-model --vision` checkpoint whose projector width is the
# demo's hidden size; tools/demo_vision.sh makes one and runs this), the tower and projector
# tensors are copied out of DIR into one extra shard, model-vision.safetensors (the text shards
# go in byte for byte as they are), the index gains their names, config.json's vision_config and
# media_placeholder_token_id become DIR's, and DIR's preprocessor_config.json goes in with the
# patch limits --patch-limit and --side-limit (the demo's context is 4,096 positions; the
# release's 65,536 patches would be 16,384 image tokens). Any vision entries the model folder
# already has are dropped first, so packing an unpacked demo again gives the same bytes.
import argparse
import gzip
import io
import json
import os
import struct
import tarfile

NEEDED = ["config.json", "model.safetensors.index.json", "tiktoken.model", "tokenizer_config.json"]
# Shipped when the export has it: the default sampling and end-of-sequence ids (the demo's is
# written by tools/train/train.py; the engine reads it as vLLM does).
OPTIONAL = ["generation_config.json"]


VISION_SHARD = "model-vision.safetensors"


def is_vision(name):
    return name.startswith("vision_tower.") or name.startswith("mm_projector.")


def read_safetensors(path):
    """The header (name -> dtype, shape, offsets) and the data bytes of one shard."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise SystemExit(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(blob[8 : 8 + n])
    return header, blob[8 + n :]


def vision_shard(vision_dir):
    """The vision tensors of a make-model checkpoint as one safetensors file (sorted names)."""
    index = json.load(open(os.path.join(vision_dir, "model.safetensors.index.json")))
    names = sorted(t for t in index["weight_map"] if is_vision(t))
    if not names:
        raise SystemExit(f"{vision_dir}: no vision_tower.* / mm_projector.* tensors (make-model --vision)")
    shards, header, data = {}, {}, bytearray()
    for t in names:
        f = index["weight_map"][t]
        if f not in shards:
            shards[f] = read_safetensors(os.path.join(vision_dir, f))
        h, d = shards[f]
        e = h[t]
        b, end = e["data_offsets"]
        header[t] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [len(data), len(data) + end - b]}
        data += d[b:end]
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    return names, struct.pack("<Q", len(text)) + text + bytes(data), len(data)


def with_vision(a, payload):
    """Rewrites config.json and the index, and adds the vision shard and preprocessor config."""
    config = json.loads(payload["config.json"])
    vconfig = json.load(open(os.path.join(a.vision, "config.json")))
    hidden = config["text_config"]["hidden_size"]
    vc = vconfig["vision_config"]
    if vc.get("text_hidden_size") != hidden:
        raise SystemExit(f"{a.vision}: vision_config.text_hidden_size is {vc.get('text_hidden_size')}, "
                         f"expected the demo's hidden_size {hidden}")
    pad = vconfig["media_placeholder_token_id"]
    tok = json.loads(payload["tokenizer_config.json"])
    if tok["added_tokens_decoder"].get(str(pad), {}).get("content") != "<|media_pad|>":
        raise SystemExit(f"{a.vision}: media_placeholder_token_id {pad} is not the demo tokenizer's <|media_pad|>")
    config["vision_config"] = vc
    config["media_placeholder_token_id"] = pad
    payload["config.json"] = (json.dumps(config, indent=1) + "\n").encode()
    names, shard, shard_data = vision_shard(a.vision)
    index = json.loads(payload["model.safetensors.index.json"])
    wm = {k: v for k, v in index["weight_map"].items() if not is_vision(k)}
    text_size = 0  # total_size counts tensor bytes (the headers' offsets), not file sizes
    for f in set(wm.values()):
        (n,) = struct.unpack("<Q", payload[f][:8])
        h = json.loads(payload[f][8 : 8 + n])
        text_size += sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in h.items() if k != "__metadata__")
    for n in names:
        wm[n] = VISION_SHARD
    index["weight_map"] = dict(sorted(wm.items()))
    index["metadata"]["total_size"] = text_size + shard_data
    payload["model.safetensors.index.json"] = (json.dumps(index, indent=1) + "\n").encode()
    payload[VISION_SHARD] = shard
    pre = json.load(open(os.path.join(a.vision, "preprocessor_config.json")))
    pre["media_proc_cfg"]["in_patch_limit"] = a.patch_limit
    pre["media_proc_cfg"]["patch_limit_on_one_side"] = a.side_limit
    payload["preprocessor_config.json"] = (json.dumps(pre, indent=1) + "\n").encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("--about", required=True, help="one sentence: what the demo model is")
    ap.add_argument("--draft", help="a draft model folder (config.json + model.safetensors) to ship as draft/")
    ap.add_argument("--drafter", help="with --draft: what the drafter is, e.g. \"its own EAGLE-3.1 drafter (...)\"")
    ap.add_argument("--vision", help="a make-model --vision checkpoint whose tower and projector go in")
    ap.add_argument("--vision-about", help="with --vision: what the tower is (demo.json's \"vision\")")
    ap.add_argument("--patch-limit", type=int, default=1024, help="with --vision: media_proc_cfg.in_patch_limit")
    ap.add_argument("--side-limit", type=int, default=64, help="with --vision: media_proc_cfg.patch_limit_on_one_side")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "assets", "demo", "k3-demo.tar.gz"))
    a = ap.parse_args()
    names = sorted(os.listdir(a.model_dir))
    for n in NEEDED:
        if n not in names:
            raise SystemExit(f"{a.model_dir} has no {n}: expected an exported checkpoint with its tokenizer")
    files = [n for n in names if n in NEEDED or n in OPTIONAL or n.endswith(".safetensors")]
    if a.vision:  # an unpacked demo's tower is replaced by the one --vision names
        files = [n for n in files if n != VISION_SHARD]
    payload = {}
    for n in files:
        with open(os.path.join(a.model_dir, n), "rb") as f:
            payload[n] = f.read()
    if a.vision:
        with_vision(a, payload)
        files = sorted(payload)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
        for n in files:
            add(n, payload[n])
        if a.draft:
            for n in ("config.json", "model.safetensors"):
                with open(os.path.join(a.draft, n), "rb") as f:
                    add("draft/" + n, f.read())
        about = {"about": a.about}
        if a.draft and a.drafter:
            about["drafter"] = a.drafter
        if a.vision and a.vision_about:
            about["vision"] = a.vision_about
        add("demo.json", (json.dumps(about, indent=1) + "\n").encode())
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "wb") as f:
        f.write(gzip.compress(raw.getvalue(), compresslevel=9, mtime=0))
    print(f"{a.out}: {os.path.getsize(a.out)} bytes ({len(raw.getvalue())} unpacked, {len(files) + 1} files)")


if __name__ == "__main__":
    main()
