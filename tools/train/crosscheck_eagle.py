# Cross-checks the engine's EAGLE-3.1 drafter (`deltafin propose`) against this independent
# PyTorch drafter (eagle.py) on the trained, exported demo drafter: both read the same files, the
# target's taps come from k3.py (float64) on the PyTorch side and from the engine's own passes on
# the other. Fails (exit 1) unless every proposal's draft ids are identical and its logits agree
# within 2e-3. Writes the PyTorch proposals to tests/data/k3-demo/eagle-expected.json, which
# tests/demo_model_test.cpp repeats through the binary without PyTorch.
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eagle  # noqa: E402
import k3  # noqa: E402
import k3data  # noqa: E402

PROMPTS = ["The king said unto", "In the beginning God created", "It is a truth universally",
           "The city of", "Love is patient, love is"]
DRAFTS = 5


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="/tmp/deltafin-train/model")
    ap.add_argument("--draft", default="/tmp/deltafin-train/eagle")
    ap.add_argument("--deltafin", default="build/src/cli/deltafin")
    ap.add_argument("--out", default="tests/data/k3-demo/eagle-expected.json")
    a = ap.parse_args()
    tok = k3data.Tokenizer.load(a.model)
    target = k3.load(a.model, torch.float64)
    draft = eagle.load(a.draft, torch.float64)
    embed = target.w("model.embed_tokens.weight").detach()
    ok, cases = True, []
    for text in PROMPTS:
        ids = tok.encode(text)
        prefix, anchor = ids[:-1], ids[-1]
        with torch.no_grad():
            _, taps = target(torch.tensor([prefix]), taps=draft.c.taps)
        want, logits = draft.propose(taps[0], prefix, anchor, DRAFTS, embed)
        with tempfile.TemporaryDirectory() as tmp:
            lf = os.path.join(tmp, "logits.f32")
            r = subprocess.run([a.deltafin, "propose", "--model", a.model, "--draft", a.draft, "--tokens",
                                ",".join(map(str, prefix)), "--anchor", str(anchor), "--drafts", str(DRAFTS),
                                "--logits-out", lf, "--json"], capture_output=True, text=True, check=True)
            got = json.loads(r.stdout)["draft_ids"]
            eng = np.fromfile(lf, dtype="<f4").reshape(DRAFTS, -1)
        diff = float(np.abs(eng - logits.numpy()).max())
        same = got == want and diff <= 2e-3
        ok &= same
        print(f"{text!r}: pytorch {want} engine {got}, max |logit diff| {diff:.2e} "
              f"{'same' if same else 'DIFFERENT'} ({tok.decode(want)!r})")
        cases.append({"prompt": text, "prefix": prefix, "anchor": anchor, "draft_ids": want})
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"what": "PyTorch (tools/train/eagle.py, float64) proposals of the demo's EAGLE-3.1 drafter",
                   "drafts": DRAFTS, "cases": cases}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
