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
import argparse
import gzip
import io
import json
import os
import tarfile

NEEDED = ["config.json", "model.safetensors.index.json", "tiktoken.model", "tokenizer_config.json"]
# Shipped when the export has it: the default sampling and end-of-sequence ids (the demo's is
# written by tools/train/train.py; the engine reads it as vLLM does).
OPTIONAL = ["generation_config.json"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("--about", required=True, help="one sentence: what the demo model is")
    ap.add_argument("--draft", help="a draft model folder (config.json + model.safetensors) to ship as draft/")
    ap.add_argument("--drafter", help="with --draft: what the drafter is, e.g. \"its own EAGLE-3.1 drafter (...)\"")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "assets", "demo", "k3-demo.tar.gz"))
    a = ap.parse_args()
    names = sorted(os.listdir(a.model_dir))
    for n in NEEDED:
        if n not in names:
            raise SystemExit(f"{a.model_dir} has no {n}: expected an exported checkpoint with its tokenizer")
    files = [n for n in names if n in NEEDED or n in OPTIONAL or n.endswith(".safetensors")]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
        for n in files:
            with open(os.path.join(a.model_dir, n), "rb") as f:
                add(n, f.read())
        if a.draft:
            for n in ("config.json", "model.safetensors"):
                with open(os.path.join(a.draft, n), "rb") as f:
                    add("draft/" + n, f.read())
        about = {"about": a.about}
        if a.draft and a.drafter:
            about["drafter"] = a.drafter
        add("demo.json", (json.dumps(about, indent=1) + "\n").encode())
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "wb") as f:
        f.write(gzip.compress(raw.getvalue(), compresslevel=9, mtime=0))
    print(f"{a.out}: {os.path.getsize(a.out)} bytes ({len(raw.getvalue())} unpacked, {len(files) + 1} files)")


if __name__ == "__main__":
    main()
