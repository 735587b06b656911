# Self-checks of the DeepSeek-V3 / Kimi K2 reference (deepseek_v3_ref.py) and the tiny
# checkpoint writer (make_tiny_deepseek_v3.py), so the goldens they produce can be trusted:
# - every quantised weight round-trips exactly: quantise in float64, pack, write, read, unpack,
#   dequantise, and compare bit for bit with the writer's own dequantised values;
# - prefill, one-token decode and prefix + rest agree (float64: <= 1e-12), the expanded and the
#   absorbed MLA agree, the MTP rows agree incrementally and at once;
# - the format facts docs/FAMILY.md states (E4M3 code table, nibble order of a packed word,
#   YaRN constants, router rules) hold on hand-made inputs;
# - the loader refuses a checkpoint that breaks the inventory and names the tensor.
# Prints one line per check and a closing "N passed, N failed"; exit status 1 on any failure.
# Run: /usr/bin/python3 tools/family/check_deepseek_v3.py   (about a minute on two cores)
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_v3_ref as R  # noqa: E402
import make_tiny_deepseek_v3 as M  # noqa: E402
import safetensors_io as st  # noqa: E402

TOKENS = [5, 17, 200, 3, 99, 42, 7, 300, 64, 128, 1, 250, 77, 8, 400, 3, 3, 3, 19, 21]
results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}{(': ' + detail) if detail else ''}")


def format_facts():
    t = R.E4M3
    check("e4m3: 0x7F and 0xFF are NaN, nothing else", np.isnan(t[[0x7F, 0xFF]]).all() and np.isnan(t).sum() == 2)
    check("e4m3: no infinities; max 448 = 0x7E, -448 = 0xFE", np.isfinite(t[~np.isnan(t)]).all() and t[0x7E] == 448 and t[0xFE] == -448)
    check("e4m3: 0x01 = 2^-9 (smallest subnormal), 0x08 = 2^-6, 0x38 = 1, 0x80 = -0",
          t[0x01] == 2.0 ** -9 and t[0x08] == 2.0 ** -6 and t[0x38] == 1.0 and t[0x80] == 0 and math.copysign(1, t[0x80]) < 0)
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    back = M.fp8_encode(t[codes])
    check("e4m3: every finite code re-encodes to itself", (back == codes).all())
    q = np.tile(np.arange(-8, 8), (3, 2))  # [3, 32]: every nibble value, twice per row
    packed = M.pack_int4(q)
    word0, word1 = int(packed.view(np.uint32)[0, 0]), int(packed.view(np.uint32)[0, 1])
    check("int4: the word of columns 0..7 = [-8..-1] is 0x76543210 (low nibble first, q+8)", word0 == 0x76543210, hex(word0))
    check("int4: the word of columns 8..15 = [0..7] is 0xFEDCBA98", word1 == 0xFEDCBA98, hex(word1))
    sbits = st.bf16_bits(np.array([[0.5], [1.0], [-2.0]]))
    shp = np.array([3, 32], dtype=np.int64)
    got = R.dequant_int4("x", st.Tensor("I32", packed.shape, packed), st.Tensor("BF16", sbits.shape, sbits),
                         st.Tensor("I64", shp.shape, shp), 32)
    check("int4: unpack(pack(q)) * scale == q * scale exactly", (got == q * np.array([[0.5], [1.0], [-2.0]])).all())
    w = np.random.default_rng(7).normal(size=(4, 64))
    p2, s2, sh2, deq2 = M.int4_quantize(w)
    got2 = R.dequant_int4("w", st.Tensor("I32", p2.shape, p2), st.Tensor("BF16", s2.shape, s2), st.Tensor("I64", sh2.shape, sh2), 32)
    codes = np.rint(deq2 / st.bf16_value(s2).repeat(32, 1))
    check("int4: quantiser output dequantises exactly, nibbles -8 and +7 both used",
          (got2 == deq2).all() and codes.min() == -8 and codes.max() == 7)


def yarn_facts():
    class C:
        pass

    c = C()
    c.rope, c.theta, c.nope = 64, 10000.0, 128
    c.rope_scaling = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    inv, cs, scale = R.rope_tables(c)
    m = 0.1 * math.log(40) + 1
    check("yarn DS-V3: cos/sin multiplier 1, softmax scale 192^-0.5 * (0.1 ln 40 + 1)^2",
          cs == 1.0 and abs(scale - 192 ** -0.5 * m * m) < 1e-15, f"{scale:.12f}")
    base = 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)
    # corr(32) = 10.47 -> low 10, corr(1) = 22.51 -> high 23
    check("yarn DS-V3: pairs 0..10 keep theta^(-2i/d), pairs >= 23 divide by 40, 11..22 blend",
          np.allclose(inv[:11], base[:11], rtol=0, atol=0) and np.allclose(inv[23:], base[23:] / 40, rtol=1e-15)
          and all(base[i] / 40 < inv[i] < base[i] for i in range(11, 23)))
    c.theta = 50000.0
    c.rope_scaling = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                      "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    inv, cs, scale = R.rope_tables(c)
    base = 1.0 / 50000.0 ** (np.arange(0, 64, 2) / 64)
    # corr(1) = 19.16 for both betas -> low 19, high 20: pairs <= 19 unscaled, >= 20 / 64
    check("yarn K2-0905 (beta 1/1): pairs 0..19 unscaled, 20..31 divided by 64",
          (inv[:20] == base[:20]).all() and np.allclose(inv[20:], base[20:] / 64, rtol=1e-15))
    x = torch.arange(8, dtype=torch.float64).reshape(1, 8)
    y = R.rotate(x, np.array([1]), np.array([math.pi / 2, 0, 0, 0]), 1.0)
    check("rope: pair (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos), interleaved", torch.allclose(y[0, :2], torch.tensor([-1.0, 0.0]), atol=1e-15) and (y[0, 2:] == x[0, 2:]).all())


def router_facts():
    class C:
        experts, topk, n_group, topk_group, norm_topk, scaling = 8, 2, 4, 2, True, 2.0

    m = R.DeepseekV3.__new__(R.DeepseekV3)
    m.cfg = C()
    logits = torch.tensor([[0.2, -0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    bias = torch.tensor([0.3, 0.3, 0.0, 0.0, 0.9, -0.9, 0.2, 0.2])
    m.w = {"model.layers.0.mlp.gate.weight": torch.eye(8), "model.layers.0.mlp.gate.e_score_correction_bias": bias}
    sel, w = m.route(logits, 0)
    s = torch.sigmoid(logits[0])
    # biased: [.850 .775 .5 .5 | 1.4 -.4 | .7 .7]; group scores (sum of the top 2 per group of 2):
    # [1.625, 1.0, 1.0, 1.4] -> groups 0 and 3 kept, so expert 4 (best biased score) is masked;
    # without the group limit the choice would be {0, 4}
    want_w = s[[0, 1]] / s[[0, 1]].sum() * 2.0
    check("router: bias picks, groups limit, weights are unbiased renormalised scores x scaling",
          sel.tolist() == [[0, 1]] and torch.allclose(w[0], want_w, rtol=0, atol=1e-15)
          and R.topk_lower_id(s + bias, 2).tolist() == [0, 4], str(sel.tolist()))
    logits2 = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    m.w["model.layers.0.mlp.gate.e_score_correction_bias"] = torch.zeros(8)
    sel2, _ = m.route(logits2, 0)
    check("router: ties (groups and experts) go to the lower index", sel2.tolist() == [[0, 1]], str(sel2.tolist()))


def variant_checks(variant, root):
    d = os.path.join(root, variant)
    b = M.write(d, variant)
    cfg = R.Config.from_dir(d)
    weights = R.load_weights(cfg, st.read_checkpoint(d))
    bad = [n for n, v in b.deq.items() if not np.array_equal(weights[n].numpy(), v)]
    quantised = sum(1 for it in b.items if it[1] in ("F8_E4M3", "I32"))
    check(f"{variant}: {len(b.deq)} tensors ({quantised} quantised) dequantise exactly as written", not bad, ", ".join(bad[:3]))
    model = R.DeepseekV3(cfg, weights)
    ties, route = [], model.route

    def watch(x, i):  # experts 5 and 6 of the first MoE layer tie exactly (make_tiny rule)
        sel, w = route(x, i)
        if i == cfg.dense_k:
            _, b = model.selection_scores(x, i)
            kth = torch.sort(b, dim=-1, descending=True).values[:, cfg.topk - 1 : cfg.topk + 1]
            for r in range(x.shape[0]):  # a tie that decides the k-th place
                if b[r, 5] == b[r, 6] == kth[r, 0] == kth[r, 1]:
                    ties.append(5 in sel[r].tolist() and 6 not in sel[r].tolist())
        return sel, w

    model.route = watch
    ref = R.run_mode(model, TOKENS, "prefill")
    model.route = route
    check(f"{variant}: exact ties decide the k-th expert in {len(ties)} rows; the lower id wins",
          ties and all(ties))
    for mode in ("decode", "split:1", "split:7", "split:19"):
        diff = float((R.run_mode(model, TOKENS, mode) - ref).abs().max())
        check(f"{variant}: {mode} == prefill", diff <= 1e-12, f"max |diff| {diff:.2e}")
    diff = float((R.run_mode(R.DeepseekV3(cfg, weights, absorbed=True), TOKENS, "prefill") - ref).abs().max())
    check(f"{variant}: absorbed MLA == expanded MLA", diff <= 1e-12, f"max |diff| {diff:.2e}")
    if cfg.nextn:
        a, c = R.mtp_rows(model, TOKENS), R.mtp_rows(model, TOKENS, "decode")
        diff = float((a - c).abs().max())
        check(f"{variant}: MTP rows at once == one at a time", diff <= 1e-12 and a.shape == (len(TOKENS) - 1, cfg.vocab), f"{diff:.2e}")
    return d


def loader_checks(d):
    work = d + "-broken"
    shutil.copytree(d, work)
    idx = json.load(open(os.path.join(work, "model.safetensors.index.json")))
    name = "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"
    shard = idx["weight_map"][name]
    path = os.path.join(work, shard)
    tensors = st.read_file(path)
    items = [(n, t.dtype, t.shape, t.raw.tobytes()) for n, t in tensors.items() if n != name]
    items.append(("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", (8,), np.zeros(8, np.float32).tobytes()))
    st.write_file(path, items)
    del idx["weight_map"][name]
    idx["weight_map"]["model.layers.0.self_attn.rotary_emb.inv_freq"] = shard
    json.dump(idx, open(os.path.join(work, "model.safetensors.index.json"), "w"))
    try:
        R.load(work)
        check("loader: a missing block scale is refused and named", False)
    except ValueError as err:
        msg = str(err)
        check("loader: a missing block scale is refused and named (rotary_emb.inv_freq ignored)",
              name in msg and "inv_freq" not in msg, msg.splitlines()[1] if "\n" in msg else msg)


def main():
    format_facts()
    yarn_facts()
    router_facts()
    root = tempfile.mkdtemp(prefix="dsv3-check-")
    try:
        dirs = {v: variant_checks(v, root) for v in M.VARIANTS}
        loader_checks(dirs["k2"])
    finally:
        shutil.rmtree(root)
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
