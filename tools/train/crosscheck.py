# Cross-checks the C++ engine against this independent PyTorch implementation on the trained,
# exported demo checkpoint, and writes what the C++ test suite needs to repeat the check
# without PyTorch (tests/data/k3-demo/): the held-out text, the PyTorch perplexity of the
# exported files (float64), and PyTorch's greedy continuations of several prompts.
# Both sides read the same exported files; the check fails (exit 1) unless the engine's
# `deltafin perplexity` is within 0.5% and every greedy continuation agrees token for token.
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3  # noqa: E402
import k3data  # noqa: E402
from train import perplexity  # noqa: E402

PROMPTS = ["The king said", "In the beginning", "It is a truth", "The city of", "Love is"]
NEW = 16


def greedy(model, ids, n):
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[-n:]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="/tmp/deltafin-train/model")
    ap.add_argument("--heldout", default="/tmp/deltafin-train/heldout.txt")
    ap.add_argument("--deltafin", default="build/src/cli/deltafin")
    ap.add_argument("--out", default="tests/data/k3-demo")
    ap.add_argument("--max-chars", type=int, default=12000, help="held-out text kept for the test")
    a = ap.parse_args()
    with open(a.heldout) as f:
        text = f.read()[: a.max_chars]
    tok = k3data.Tokenizer.load(a.model)
    ids = tok.encode(text)[:2048]
    model = k3.load(a.model, torch.float64)
    ppl_torch = perplexity(model, ids)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "heldout.txt"), "w") as f:
        f.write(text)
    eng = json.loads(subprocess.run([a.deltafin, "perplexity", "--model", a.model, "--file",
                                     os.path.join(a.out, "heldout.txt"), "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    ok = eng["tokens"] == len(ids)
    rel = abs(eng["perplexity"] - ppl_torch) / ppl_torch
    ok &= rel <= 0.005
    print(f"perplexity: pytorch {ppl_torch:.4f}, engine {eng['perplexity']:.4f} (rel diff {rel:.2e}), "
          f"tokens {len(ids)} vs {eng['tokens']}")
    cases = []
    for p in PROMPTS:
        pid = tok.encode(p)
        want = greedy(model, pid, NEW)
        r = json.loads(subprocess.run([a.deltafin, "run", "--model", a.model, "--prompt-ids",
                                       ",".join(map(str, pid)), "--max-new", str(NEW), "--json"],
                                      capture_output=True, text=True, check=True).stdout)
        same = r["completion_ids"] == want
        ok &= same
        print(f"greedy {p!r}: {'same' if same else 'DIFFERENT'} {tok.decode(want)!r}")
        if not same:
            print(f"  pytorch {want}\n  engine  {r['completion_ids']}")
        cases.append({"prompt": p, "prompt_ids": pid, "completion_ids": want})
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump({"what": "PyTorch (tools/train, float64) on the exported demo checkpoint",
                   "heldout": "heldout.txt", "tokens": len(ids), "window": 512,
                   "perplexity": ppl_torch, "greedy": cases}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
