# Proves the PyTorch K3 (k3.py) against the engine's float64 golden data before any training:
# logits of both tiny checkpoints (BF16 experts and MXFP4 experts) and the greedy continuation.
import json, os, sys
import numpy as np, torch
import k3

def check(case_dir):
    case = json.load(open(os.path.join(case_dir, "case.json")))
    m = k3.load(os.path.join(case_dir, case["model"]), torch.float64, chunk=int(sys.argv[1]) if len(sys.argv) > 1 else 7)
    with torch.no_grad():
        logits = m(torch.tensor([case["tokens"]]))[0]
    ref = torch.from_numpy(np.fromfile(os.path.join(case_dir, case["logits_file"]), dtype=np.float32).astype(np.float64)).reshape(case["logits_shape"])
    err = ((logits - ref).abs().max() / ref.abs().max()).item()
    toks = list(case["greedy_prompt"])
    with torch.no_grad():
        for _ in range(len(case["greedy_continuation"])):
            toks.append(int(m(torch.tensor([toks]))[0, -1].argmax()))
    ok = toks[len(case["greedy_prompt"]):] == case["greedy_continuation"]
    print(f"{case_dir}: max rel err {err:.2e}, greedy {'ok' if ok else 'MISMATCH'}")
    return err < 1e-4 and ok

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(here, "..", "..", "tests", "data")
sys.exit(0 if all([check(os.path.join(data, d)) for d in ("k3-tiny-bf16", "k3-tiny-mxfp4")]) else 1)
