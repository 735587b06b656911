#!/usr/bin/python3
# An independent float64 PyTorch reference of the Kimi-Linear forward pass
# (moonshotai/Kimi-Linear-48B-A3B-*, KimiLinearForCausalLM), written from docs/FAMILY.md
# ("Kimi-Linear"), sharing no code with the C++ engine. It exists to produce golden logits the
# engine is compared with, in the engine's three pass modes: prefill (one pass), decode (one
# token per pass over a kept state) and split:N (prefill N tokens, then decode), so the state
# hand-over (KDA recurrent state and short-conv history, MLA latent cache) is checked too.
# Everything is float64 over the stored BF16/F32 weights. The KDA recurrence has two
# formulations, the stepwise delta rule (the oracle) and the exact chunkwise form, and MLA two
# (expanded and weight-absorbed); `selfcheck` proves they agree. Where public implementations
# disagree (the router's weights, the MLA latent-norm epsilon) the default is the one
# docs/FAMILY.md chooses and a flag selects the other. Development tool only (Debian's
# python3-torch 1.13 and python3-numpy); Deltafin never runs Python.
import argparse
import copy
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kimi_linear_format as fmt  # noqa: E402

L2_EPS = 1e-6  # KDA q/k L2 normalisation: v / sqrt(sum v^2 + 1e-6)
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above this, as the reference gate kernel does
MAX_TOKENS = 1 << 16


class Options:
    def __init__(self, router_weights="unbiased", mla_eps=1e-6, kda="stepwise"):
        if router_weights not in ("unbiased", "biased"):
            raise ValueError("router_weights: expected unbiased or biased")
        self.router_weights = router_weights
        self.mla_eps = mla_eps
        self.kda_chunk = 0
        if kda != "stepwise":
            if not kda.startswith("chunk:") or not kda[6:].isdigit() or int(kda[6:]) < 1:
                raise ValueError(f"--kda {kda}: expected stepwise or chunk:C with C >= 1")
            self.kda_chunk = int(kda[6:])


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def l2n(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


# ------------------------------------------------------------------------------------ KDA


def kda_stepwise(q, k, v, g, beta, S):
    """The delta rule row by row. q,k: [T,H,dk]; v: [T,H,dv]; g: [T,H,dk] log-decay;
    beta: [T,H]; S: [H,dk,dv] (updated in place). Returns o [T,H,dv]."""
    out = []
    for t in range(q.shape[0]):
        S.mul_(torch.exp(g[t]).unsqueeze(-1))  # S <- diag(alpha) S
        e = v[t] - torch.einsum("hkv,hk->hv", S, k[t])  # prediction error
        S.add_(beta[t].view(-1, 1, 1) * k[t].unsqueeze(-1) * e.unsqueeze(1))  # S += beta k e^T
        out.append(torch.einsum("hkv,hk->hv", S, q[t]))  # read the updated state
    return torch.stack(out)


def kda_chunked(q, k, v, g, beta, S, C):
    """The same recurrence in the exact chunkwise form (docs/MODEL.md §3.5): within a chunk
    only non-positive log-decay differences are exponentiated, so it is valid without a lower
    bound on g (Kimi-Linear has none). Same arguments as kda_stepwise."""
    T, H, dk = q.shape
    out = []
    for s in range(0, T, C):
        qc, kc, vc, gc, bc = (x[s : s + C] for x in (q, k, v, g, beta))
        n = qc.shape[0]
        G = gc.cumsum(0)  # [n,H,dk], G_r = sum_{j<=r} g_j
        diff = G.unsqueeze(1) - G.unsqueeze(0)  # [r,i,H,dk] = G_r - G_i
        incl = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(n, n, 1, 1)
        dec = torch.exp(torch.where(incl, diff, torch.full_like(diff, -math.inf)))
        A = torch.einsum("rhd,ihd,rihd->hri", kc, kc, dec)
        A = A * torch.tril(torch.ones(n, n, dtype=q.dtype), -1)  # strictly lower
        eG = torch.exp(G)
        rhs = vc - torch.einsum("rhd,hdv->rhv", eG * kc, S)  # v_r - S0^T (e^{G_r} k_r)
        delta = torch.zeros_like(vc)
        for r in range(n):  # forward substitution
            acc = rhs[r] - torch.einsum("hi,ihv->hv", A[:, r, :r], delta[:r])
            delta[r] = bc[r].unsqueeze(-1) * acc
        Pq = torch.einsum("ihd,rhd,rihd->hri", kc, qc, dec)  # i <= r (dec is 0 above)
        o = torch.einsum("rhd,hdv->rhv", eG * qc, S) + torch.einsum("hri,ihv->rhv", Pq, delta)
        out.append(o)
        GC = G[-1]  # [H,dk]
        S.copy_(torch.exp(GC).unsqueeze(-1) * S + torch.einsum("ihd,ihv->hdv", torch.exp(GC.unsqueeze(0) - G) * kc, delta))
    return torch.cat(out)


# ------------------------------------------------------------------------------------ model


class State:
    """Per-sequence state: for KDA layers the last K-1 pre-conv q/k/v rows and S [H,dk,dv];
    for MLA layers the normalised latent and the shared pe part of every position so far."""

    def __init__(self, model):
        c = model.cfg
        P = c.kda_heads * c.kda_dim
        self.pos = 0
        self.layers = []
        for i in range(c.layers):
            if c.is_kda(i):
                z = torch.zeros(c.conv - 1, P, dtype=torch.float64)
                self.layers.append({"conv": [z.clone(), z.clone(), z.clone()], "S": torch.zeros(c.kda_heads, c.kda_dim, c.kda_dim, dtype=torch.float64)})
            else:
                self.layers.append({"c": torch.zeros(0, c.kv_lora, dtype=torch.float64), "kpe": torch.zeros(0, c.rope, dtype=torch.float64)})


class KimiLinear:
    def __init__(self, cfg, tensors, opts):
        self.cfg, self.opts = cfg, opts
        self.w = {n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in tensors.items()}
        if cfg.tie:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.mla_absorbed = False
        self.trace = None  # selfcheck: a dict that collects decay and routing statistics

    def new_state(self):
        return State(self)

    # -- KDA
    def kda(self, u, i, st):
        c, w = self.cfg, self.w
        a = f"model.layers.{i}.self_attn."
        T, H, D = u.shape[0], c.kda_heads, c.kda_dim

        def conv(x, j, name):
            hist = st["conv"][j]
            full = torch.cat([hist, x])  # [K-1+T, P], oldest first
            wt = w[a + name][:, 0, :]  # [P, K]; tap K-1 multiplies the current row
            y = torch.stack([(full[t : t + c.conv] * wt.T).sum(0) for t in range(T)])
            st["conv"][j] = full[full.shape[0] - (c.conv - 1) :].clone()
            return F.silu(y)

        q = conv(u @ w[a + "q_proj.weight"].T, 0, "q_conv1d.weight").view(T, H, D)
        k = conv(u @ w[a + "k_proj.weight"].T, 1, "k_conv1d.weight").view(T, H, D)
        v = conv(u @ w[a + "v_proj.weight"].T, 2, "v_conv1d.weight").view(T, H, D)
        q = l2n(q) * D ** -0.5
        k = l2n(k)
        z = (u @ w[a + "f_a_proj.weight"].T) @ w[a + "f_b_proj.weight"].T + w[a + "dt_bias"]
        A = torch.exp(w[a + "A_log"].reshape(H)).view(1, H, 1)
        g = -A * F.softplus(z.view(T, H, D), beta=1.0, threshold=SOFTPLUS_THRESHOLD)
        beta = torch.sigmoid(u @ w[a + "b_proj.weight"].T)  # [T,H]
        if self.trace is not None:
            self.trace.setdefault("g", []).append(g.reshape(-1))
        if self.opts.kda_chunk:
            o = kda_chunked(q, k, v, g, beta, st["S"], self.opts.kda_chunk)
        else:
            o = kda_stepwise(q, k, v, g, beta, st["S"])
        gate = (u @ w[a + "g_a_proj.weight"].T) @ w[a + "g_b_proj.weight"].T
        o = rms(o, w[a + "o_norm.weight"], c.eps) * torch.sigmoid(gate.view(T, H, D))
        return o.reshape(T, H * D) @ w[a + "o_proj.weight"].T

    # -- MLA
    def mla(self, u, i, st):
        c, w = self.cfg, self.w
        a = f"model.layers.{i}.self_attn."
        T, M, dn, dr, dv = u.shape[0], c.mla_heads, c.nope, c.rope, c.vdim
        q = (u @ w[a + "q_proj.weight"].T).view(T, M, dn + dr)
        qn, qp = q[..., :dn], q[..., dn:]
        ckv = u @ w[a + "kv_a_proj_with_mqa.weight"].T
        lat = rms(ckv[:, : c.kv_lora], w[a + "kv_a_layernorm.weight"], self.opts.mla_eps)
        st["c"] = torch.cat([st["c"], lat])
        st["kpe"] = torch.cat([st["kpe"], ckv[:, c.kv_lora :]])
        N = st["c"].shape[0]
        p0 = N - T  # position of the first new row
        Wkv = w[a + "kv_b_proj.weight"].view(M, dn + dv, c.kv_lora)
        if self.mla_absorbed:  # scores and values through the latent (what decode kernels do)
            qt = torch.einsum("thd,hdr->thr", qn, Wkv[:, :dn, :])
            s = torch.einsum("thr,jr->thj", qt, st["c"]) + torch.einsum("thd,jd->thj", qp, st["kpe"])
        else:
            kv = (st["c"] @ w[a + "kv_b_proj.weight"].T).view(N, M, dn + dv)
            s = torch.einsum("thd,jhd->thj", qn, kv[..., :dn]) + torch.einsum("thd,jd->thj", qp, st["kpe"])
        s = s * (dn + dr) ** -0.5
        mask = torch.arange(N).view(1, N) > (p0 + torch.arange(T)).view(T, 1)  # j > position
        s = s.masked_fill(mask.unsqueeze(1), -math.inf)
        P = torch.softmax(s, dim=-1)
        if self.mla_absorbed:
            ob = torch.einsum("thj,jr->thr", P, st["c"])
            o = torch.einsum("thr,hvr->thv", ob, Wkv[:, dn:, :])
        else:
            o = torch.einsum("thj,jhv->thv", P, kv[..., dn:])
        return o.reshape(T, M * dv) @ w[a + "o_proj.weight"].T

    # -- FFN
    def mlp(self, x, p):
        w = self.w
        return (F.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T

    def route(self, x, i):
        """(selected ids ascending [T,k], weights [T,k]) for each row."""
        c, w = self.cfg, self.w
        m = f"model.layers.{i}.block_sparse_moe."
        s = torch.sigmoid(x @ w[m + "gate.weight"].T)  # [T,E]
        biased = s + w[m + "gate.e_score_correction_bias"]
        order = torch.sort(biased, dim=-1, descending=True, stable=True).indices  # ties: lower id
        sel = torch.sort(order[:, : c.topk], dim=-1).values
        if self.trace is not None:
            plain = torch.sort(torch.sort(s, dim=-1, descending=True, stable=True).indices[:, : c.topk], dim=-1).values
            self.trace["rows"] = self.trace.get("rows", 0) + x.shape[0]
            self.trace["bias_moved"] = self.trace.get("bias_moved", 0) + int((plain != sel).any(-1).sum())
        src = biased if self.opts.router_weights == "biased" else s
        wt = torch.gather(src, 1, sel)
        if c.renorm and c.topk > 1:
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        return sel, wt * c.scaling

    def moe(self, x, i):
        c, w = self.cfg, self.w
        m = f"model.layers.{i}.block_sparse_moe."
        sel, wt = self.route(x, i)
        routed = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(c.topk):  # ascending expert id
                e = int(sel[t, j])
                p = m + f"experts.{e}."
                h = F.silu(x[t] @ w[p + "w1.weight"].T) * (x[t] @ w[p + "w3.weight"].T)
                routed[t] += wt[t, j] * (h @ w[p + "w2.weight"].T)
        if c.shared > 0:
            return routed + self.mlp(x, m + "shared_experts.")
        return routed

    # -- whole model
    def forward(self, st, tokens):
        """Logits [T,V] (float64) for `tokens` continuing the sequence held in `st`."""
        c, w = self.cfg, self.w
        ids = torch.tensor(tokens, dtype=torch.long)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= c.vocab:
            raise ValueError(f"token ids must be in 0..{c.vocab - 1}")
        h = w["model.embed_tokens.weight"][ids]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            u = rms(h, w[p + "input_layernorm.weight"], c.eps)
            h = h + (self.kda(u, i, st.layers[i]) if c.is_kda(i) else self.mla(u, i, st.layers[i]))
            x = rms(h, w[p + "post_attention_layernorm.weight"], c.eps)
            h = h + (self.moe(x, i) if c.is_moe(i) else self.mlp(x, p + "mlp."))
        st.pos += len(tokens)
        return rms(h, w["model.norm.weight"], c.eps) @ w["lm_head.weight"].T

    def logits(self, tokens, mode):
        """All-position logits [T,V] in one of the engine's pass modes."""
        split = mode_split(mode, len(tokens))
        st = self.new_state()
        rows = []
        if split > 0:
            rows.append(self.forward(st, tokens[:split]))
        for t in range(split, len(tokens)):
            rows.append(self.forward(st, tokens[t : t + 1]))
        return torch.cat(rows)

    def greedy(self, prompt, n):
        """(continuation, smallest top-1/top-2 gap) decoding one token per pass."""
        st = self.new_state()
        last = self.forward(st, prompt)[-1]
        out, margin = [], math.inf
        for _ in range(n):
            top = torch.sort(last, descending=True, stable=True)
            nxt = int(top.indices[0])
            margin = min(margin, float(top.values[0] - top.values[1]))
            out.append(nxt)
            last = self.forward(st, [nxt])[-1]
        return out, margin


def mode_split(mode, T):
    if mode == "prefill":
        return T
    if mode == "decode":
        return 0
    if mode.startswith("split:") and mode[6:].isdigit() and int(mode[6:]) <= T:
        return int(mode[6:])
    raise ValueError(f"--mode {mode}: expected prefill, decode or split:N with N in 0..{T}")


def load(model_dir, opts):
    cfg, tensors = fmt.load_checkpoint(model_dir)
    return KimiLinear(cfg, tensors, opts)


# ------------------------------------------------------------------------------ self-check


def selfcheck(model, tokens, tol):
    """Every formulation and pass mode against the prefill of the stepwise/expanded model."""
    torch.set_printoptions(precision=3)
    ok = True
    ref = model.logits(tokens, "prefill")
    scale = float(ref.abs().max())

    def report(what, got, expect_equal=True):
        nonlocal ok
        d = float((got - ref).abs().max())
        good = d <= tol * max(1.0, scale) if expect_equal else d > 1e-3
        ok &= good
        print(f"  {what:<44} max|diff| {d:.3e}  {'ok' if good else 'FAIL'}")

    print(f"{len(tokens)} tokens, max |logit| {scale:.3f}, tolerance {tol:g} x max(1, max|logit|)")
    model.trace = {}
    model.logits(tokens, "prefill")
    g = torch.cat(model.trace["g"])
    tiny = float((g < math.log(np.finfo(np.float32).tiny)).double().mean())
    print(f"  KDA log-decays: min {float(g.min()):.1f}, max {float(g.max()):.2e}; {100 * tiny:.1f}% have exp(g) below"
          f" float32's smallest normal; per-step g below -5 (K3's bound): {100 * float((g < -5).double().mean()):.1f}%")
    print(f"  router: the correction bias changes the selected set in {model.trace['bias_moved']} of {model.trace['rows']} (row, layer) routings")
    model.trace = None
    T = len(tokens)
    for mode in ["decode", "split:1", f"split:{T // 2}", f"split:{T - 1}"]:
        report(f"{mode} vs prefill", model.logits(tokens, mode))
    saved = model.opts.kda_chunk
    for C in (1, 2, 5, 16, T):
        model.opts.kda_chunk = C
        report(f"KDA chunk:{C} prefill vs stepwise", model.logits(tokens, "prefill"))
    model.opts.kda_chunk = 5
    report("KDA chunk:5 split:7 vs stepwise prefill", model.logits(tokens, f"split:{min(7, T)}"))
    model.opts.kda_chunk = saved
    model.mla_absorbed = True
    report("MLA absorbed vs expanded (prefill)", model.logits(tokens, "prefill"))
    report("MLA absorbed vs expanded (decode)", model.logits(tokens, "decode"))
    model.mla_absorbed = False
    # Sensitivities: each must change the logits, or the tiny model would not pin the choice.
    saved = model.opts.router_weights
    model.opts.router_weights = "unbiased" if saved == "biased" else "biased"
    report("router weights from the other scores (must differ)", model.logits(tokens, "prefill"), False)
    model.opts.router_weights = saved
    saved = model.opts.mla_eps
    model.opts.mla_eps = 1e-5 if saved == 1e-6 else 1e-6
    d = float((model.logits(tokens, "prefill") - ref).abs().max())
    print(f"  MLA latent-norm eps {model.opts.mla_eps:g} instead of {saved:g}: max|diff| {d:.3e} (informative)")
    model.opts.mla_eps = saved
    return ok


# ------------------------------------------------------------------------------------ CLI


def parse_ids(s, what):
    try:
        ids = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise SystemExit(f"{what}: expected comma-separated token ids, got {s!r}")
    if not ids or len(ids) > MAX_TOKENS:
        raise SystemExit(f"{what}: expected 1..{MAX_TOKENS} token ids")
    return ids


def write_f32(path, t):
    data = t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def reference_text(opts):
    return (
        "float64 evaluation of the Kimi-Linear semantics in docs/FAMILY.md (tools/family/kimi_linear_ref.py); "
        f"router weights from the {opts.router_weights} sigmoid scores; MLA kv_a_layernorm eps {opts.mla_eps:g}; "
        f"KDA q/k L2 eps {L2_EPS:g}; softplus threshold {SOFTPLUS_THRESHOLD:g}; all other norms rms_norm_eps"
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__ or "Kimi-Linear float64 reference")
    ap.add_argument("command", choices=["logits", "case", "selfcheck", "inventory"])
    ap.add_argument("--model", help="checkpoint folder (config.json, index, shards)")
    ap.add_argument("--config", help="inventory: a config.json to list the tensors of")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--mode", default="prefill", help="prefill, decode or split:N")
    ap.add_argument("--out", help="logits: output file (float32 LE [T, vocab])")
    ap.add_argument("--out-dir", help="case: folder for case.json and logits.f32")
    ap.add_argument("--model-ref", default="model", help="case: the model path written into case.json")
    ap.add_argument("--greedy-prompt", help="case: prompt ids for the greedy continuation")
    ap.add_argument("--greedy-new", type=int, default=12, help="case: tokens to continue")
    ap.add_argument("--router-weights", default="unbiased", choices=["unbiased", "biased"],
                    help="weights from the unbiased sigmoid scores (default; vLLM, SGLang, llama.cpp) "
                         "or from the bias-corrected ones (the HF modeling_kimi.py aliasing)")
    ap.add_argument("--mla-eps", type=float, default=1e-6, help="MLA kv_a_layernorm epsilon (HF: 1e-6; vLLM/SGLang/llama.cpp: rms_norm_eps)")
    ap.add_argument("--kda", default="stepwise", help="stepwise or chunk:C")
    ap.add_argument("--tol", type=float, default=1e-12, help="selfcheck: relative tolerance")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.command == "inventory":
        if not a.config:
            raise SystemExit("inventory: --config is required")
        with open(a.config, encoding="utf-8") as f:
            cfg = fmt.KLConfig(json.load(f))
        inv = fmt.expected_tensors(cfg)
        for n, (s, d) in inv.items():
            print(f"{n}\t{d}\t{list(s)}")
        print(f"# {len(inv)} tensors, {fmt.parameter_count(cfg)} parameters")
        return 0
    if not a.model:
        raise SystemExit(f"{a.command}: --model is required")
    try:
        opts = Options(a.router_weights, a.mla_eps, a.kda)
        model = load(a.model, opts)
    except (fmt.FormatError, ValueError) as e:
        raise SystemExit(f"error: {e}")
    if a.command == "selfcheck":
        toks = parse_ids(a.tokens, "--tokens") if a.tokens else [(37 * i + 11) % model.cfg.vocab for i in range(24)]
        return 0 if selfcheck(model, toks, a.tol) else 1
    toks = parse_ids(a.tokens or "", "--tokens")
    try:
        if a.command == "logits":
            if not a.out:
                raise SystemExit("logits: --out is required")
            write_f32(a.out, model.logits(toks, a.mode))
            return 0
        if not a.out_dir or not a.greedy_prompt:
            raise SystemExit("case: --out-dir and --greedy-prompt are required")
        if not 1 <= a.greedy_new <= 4096:
            raise SystemExit("case: --greedy-new must be in 1..4096")
        prompt = parse_ids(a.greedy_prompt, "--greedy-prompt")
        logits = model.logits(toks, a.mode)
        cont, margin = model.greedy(prompt, a.greedy_new)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    os.makedirs(a.out_dir, mode=0o700, exist_ok=True)
    write_f32(os.path.join(a.out_dir, "logits.f32"), logits)
    case = {
        "model": a.model_ref,
        "tokens": toks,
        "logits_file": "logits.f32",
        "logits_shape": [len(toks), model.cfg.vocab],
        "logits_dtype": "float32 little-endian, row-major [position, vocab]",
        "greedy_prompt": prompt,
        "greedy_continuation": cont,
        "greedy_min_margin": margin,
        "reference": reference_text(opts),
    }
    fd = os.open(os.path.join(a.out_dir, "case.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
