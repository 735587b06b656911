# The Kimi-Linear checkpoint format as docs/FAMILY.md ("Kimi-Linear") states it: the config
# fields and the rules read from them, the exact tensor inventory (names, shapes, dtypes), and a
# small safetensors reader/writer (Debian 12 has no safetensors package). It is shared by the
# float64 reference (kimi_linear_ref.py) and the tiny-checkpoint writer
# (make_tiny_kimi_linear.py), so both agree on one inventory; neither shares code with the C++
# engine. Development tool only (Debian's python3-numpy and python3-torch), never run by
# Deltafin. Everything read from a file is treated as hostile: sizes, offsets, names and dtypes
# are checked before use, and every problem is reported with what was expected.
import json
import math
import os
import struct

import numpy as np

ARCHITECTURE = "KimiLinearForCausalLM"
MODEL_TYPE = "kimi_linear"

# safetensors dtypes this format uses, with their element sizes.
DTYPE_SIZE = {"BF16": 2, "F32": 4}
MAX_HEADER = 64 << 20  # a header larger than this is refused (the release's is ~2 MB)
MAX_SHARDS = 4096


class FormatError(Exception):
    """A checkpoint or config that does not have the Kimi-Linear release layout."""


# ------------------------------------------------------------------------------------ config


def _need(d, key, types, where="config.json"):
    if key not in d:
        raise FormatError(f"{where}: missing field '{key}'")
    v = d[key]
    if isinstance(v, bool) and bool not in types:
        raise FormatError(f"{where}: field '{key}' is {v!r}; expected {' or '.join(t.__name__ for t in types)}")
    if not isinstance(v, types):
        raise FormatError(f"{where}: field '{key}' is {v!r}; expected {' or '.join(t.__name__ for t in types)}")
    return v


def _pos_int(d, key, where="config.json", lo=1, hi=1 << 24):
    v = _need(d, key, (int,), where)
    if not lo <= v <= hi:
        raise FormatError(f"{where}: field '{key}' = {v}; expected an integer in {lo}..{hi}")
    return v


class KLConfig:
    """The fields of a Kimi-Linear config.json the forward pass depends on, validated.
    Values the released modeling code refuses (q_lora_rank set, mla_use_nope false, a
    non-SiLU activation) or that no Kimi-Linear release uses and whose semantics were not
    verified (expert groups, softmax routing, MTP layers) are rejected, not guessed."""

    def __init__(self, c):
        if not isinstance(c, dict):
            raise FormatError("config.json: expected a JSON object")
        arch = _need(c, "architectures", (list,))
        if arch != [ARCHITECTURE]:
            raise FormatError(f"config.json: architectures = {arch!r}; expected ['{ARCHITECTURE}']")
        if _need(c, "model_type", (str,)) != MODEL_TYPE:
            raise FormatError(f"config.json: model_type = {c['model_type']!r}; expected '{MODEL_TYPE}'")
        self.raw = c
        self.hidden = _pos_int(c, "hidden_size")
        self.layers = _pos_int(c, "num_hidden_layers", hi=4096)
        self.vocab = _pos_int(c, "vocab_size", hi=1 << 22)
        self.eps = float(_need(c, "rms_norm_eps", (int, float)))
        if not (0 < self.eps < 1):
            raise FormatError(f"config.json: rms_norm_eps = {self.eps}; expected a small positive number")
        self.inter = _pos_int(c, "intermediate_size")
        if _need(c, "hidden_act", (str,)) != "silu":
            raise FormatError(f"config.json: hidden_act = {c['hidden_act']!r}; expected 'silu'")
        self.tie = _need(c, "tie_word_embeddings", (bool,))
        # MLA
        self.mla_heads = _pos_int(c, "num_attention_heads")
        kvh = _pos_int(c, "num_key_value_heads")
        if kvh != self.mla_heads:
            raise FormatError(f"config.json: num_key_value_heads = {kvh}; expected {self.mla_heads} (= num_attention_heads)")
        if c.get("q_lora_rank", None) is not None:
            raise FormatError(f"config.json: q_lora_rank = {c['q_lora_rank']!r}; Kimi-Linear's MLA has no query LoRA (expected null)")
        if _need(c, "mla_use_nope", (bool,)) is not True:
            raise FormatError("config.json: mla_use_nope must be true (Kimi-Linear's MLA applies no RoPE)")
        self.kv_lora = _pos_int(c, "kv_lora_rank")
        self.nope = _pos_int(c, "qk_nope_head_dim")
        self.rope = _pos_int(c, "qk_rope_head_dim")
        self.vdim = _pos_int(c, "v_head_dim")
        # KDA
        la = _need(c, "linear_attn_config", (dict,))
        w = "config.json linear_attn_config"
        self.kda_heads = _pos_int(la, "num_heads", w)
        self.kda_dim = _pos_int(la, "head_dim", w)
        self.conv = _pos_int(la, "short_conv_kernel_size", w, hi=64)
        for k in ("use_full_rank_gate", "gate_lower_bound"):
            if la.get(k) not in (None, False):
                raise FormatError(f"{w}: '{k}' = {la[k]!r} is a K3 field; Kimi-Linear has no full-rank gate and no gate lower bound")
        kda = _need(la, "kda_layers", (list,), w)
        full = _need(la, "full_attn_layers", (list,), w)
        for name, lst in (("kda_layers", kda), ("full_attn_layers", full)):
            for x in lst:
                if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= self.layers:
                    raise FormatError(f"{w}: {name} holds {x!r}; expected 1-based layer numbers in 1..{self.layers}")
            if len(set(lst)) != len(lst):
                raise FormatError(f"{w}: {name} repeats a layer")
        if set(kda) & set(full) or set(kda) | set(full) != set(range(1, self.layers + 1)):
            raise FormatError(f"{w}: kda_layers and full_attn_layers must partition 1..{self.layers}")
        self.kda_layers = {x - 1 for x in kda}  # 0-based from here on
        # MoE
        self.experts = _pos_int(c, "num_experts", hi=1 << 16)
        self.topk = _pos_int(c, "num_experts_per_token", hi=self.experts)
        self.shared = _need(c, "num_shared_experts", (int,))
        if not 0 <= self.shared <= 64:
            raise FormatError(f"config.json: num_shared_experts = {self.shared}; expected 0..64")
        self.moe_inter = _pos_int(c, "moe_intermediate_size")
        self.dense_k = _need(c, "first_k_dense_replace", (int,))
        if not 0 <= self.dense_k <= self.layers:
            raise FormatError(f"config.json: first_k_dense_replace = {self.dense_k}; expected 0..{self.layers}")
        self.moe_freq = _pos_int(c, "moe_layer_freq", hi=self.layers)
        self.renorm = _need(c, "moe_renormalize", (bool,))
        self.scaling = float(_need(c, "routed_scaling_factor", (int, float)))
        if not (math.isfinite(self.scaling) and self.scaling > 0):
            raise FormatError(f"config.json: routed_scaling_factor = {self.scaling}; expected a positive number")
        if _need(c, "moe_router_activation_func", (str,)) != "sigmoid":
            raise FormatError(f"config.json: moe_router_activation_func = {c['moe_router_activation_func']!r}; only 'sigmoid' is specified")
        if c.get("num_expert_group", 1) != 1 or c.get("topk_group", 1) != 1:
            raise FormatError("config.json: num_expert_group and topk_group must be 1 (group-limited routing is not specified for Kimi-Linear)")
        if c.get("num_nextn_predict_layers", 0) != 0:
            raise FormatError("config.json: num_nextn_predict_layers must be 0 (no MTP layers are specified)")
        for k in ("attn_res_block_size", "routed_expert_hidden_size", "quantization_config", "mla_use_output_gate"):
            if c.get(k) not in (None, False):
                raise FormatError(f"config.json: '{k}' is a K3 field; a Kimi-Linear checkpoint must not set it")

    def is_kda(self, i):
        return i in self.kda_layers

    def is_moe(self, i):
        return i >= self.dense_k and i % self.moe_freq == 0


# ----------------------------------------------------------------------------- inventory


def expected_tensors(cfg):
    """Ordered {name: (shape, dtype)} of every tensor of the checkpoint (release dtypes)."""
    H, P, D = cfg.hidden, cfg.kda_heads * cfg.kda_dim, cfg.kda_dim
    out = {"model.embed_tokens.weight": ((cfg.vocab, H), "BF16")}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ((H,), "BF16")
        out[p + "post_attention_layernorm.weight"] = ((H,), "BF16")
        a = p + "self_attn."
        if cfg.is_kda(i):
            for n in ("q", "k", "v"):
                out[a + f"{n}_proj.weight"] = ((P, H), "BF16")
                out[a + f"{n}_conv1d.weight"] = ((P, 1, cfg.conv), "BF16")
            out[a + "A_log"] = ((1, 1, cfg.kda_heads, 1), "F32")
            out[a + "dt_bias"] = ((P,), "F32")
            out[a + "f_a_proj.weight"] = ((D, H), "BF16")
            out[a + "f_b_proj.weight"] = ((P, D), "BF16")
            out[a + "b_proj.weight"] = ((cfg.kda_heads, H), "BF16")
            out[a + "g_a_proj.weight"] = ((D, H), "BF16")
            out[a + "g_b_proj.weight"] = ((P, D), "BF16")
            out[a + "o_norm.weight"] = ((D,), "BF16")
            out[a + "o_proj.weight"] = ((H, P), "BF16")
        else:
            M = cfg.mla_heads
            out[a + "q_proj.weight"] = ((M * (cfg.nope + cfg.rope), H), "BF16")
            out[a + "kv_a_proj_with_mqa.weight"] = ((cfg.kv_lora + cfg.rope, H), "BF16")
            out[a + "kv_a_layernorm.weight"] = ((cfg.kv_lora,), "BF16")
            out[a + "kv_b_proj.weight"] = ((M * (cfg.nope + cfg.vdim), cfg.kv_lora), "BF16")
            out[a + "o_proj.weight"] = ((H, M * cfg.vdim), "BF16")
        if cfg.is_moe(i):
            m = p + "block_sparse_moe."
            out[m + "gate.weight"] = ((cfg.experts, H), "BF16")
            out[m + "gate.e_score_correction_bias"] = ((cfg.experts,), "BF16")
            for e in range(cfg.experts):
                out[m + f"experts.{e}.w1.weight"] = ((cfg.moe_inter, H), "BF16")
                out[m + f"experts.{e}.w2.weight"] = ((H, cfg.moe_inter), "BF16")
                out[m + f"experts.{e}.w3.weight"] = ((cfg.moe_inter, H), "BF16")
            if cfg.shared > 0:
                S = cfg.moe_inter * cfg.shared
                out[m + "shared_experts.gate_proj.weight"] = ((S, H), "BF16")
                out[m + "shared_experts.up_proj.weight"] = ((S, H), "BF16")
                out[m + "shared_experts.down_proj.weight"] = ((H, S), "BF16")
        else:
            out[p + "mlp.gate_proj.weight"] = ((cfg.inter, H), "BF16")
            out[p + "mlp.up_proj.weight"] = ((cfg.inter, H), "BF16")
            out[p + "mlp.down_proj.weight"] = ((H, cfg.inter), "BF16")
    out["model.norm.weight"] = ((H,), "BF16")
    if not cfg.tie:
        out["lm_head.weight"] = ((cfg.vocab, H), "BF16")
    return out


# ---------------------------------------------------------------------------- safetensors


def bf16_bits_to_f64(u16):
    """BF16 bit patterns (uint16 array) -> float64, exactly."""
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f64_to_bf16_bits(x):
    """float64 -> BF16 bit patterns, rounding to nearest even (via float32, which is exact for
    the generator's values that are first rounded to float32)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_safetensors_header(path):
    """(header dict without __metadata__, data offset, data length), fully validated."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FormatError(f"{path}: shorter than the 8-byte safetensors header length")
        n = struct.unpack("<Q", raw)[0]
        if n < 2 or n > MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: header length {n} is not within 2..{min(MAX_HEADER, size - 8)}")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{path}: header is not UTF-8 JSON ({e})")
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    spans = []
    for name, meta in header.items():
        if not isinstance(meta, dict) or set(meta) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"{path}: tensor {name!r}: expected dtype, shape and data_offsets")
        dt, shape, offs = meta["dtype"], meta["shape"], meta["data_offsets"]
        if dt not in DTYPE_SIZE:
            raise FormatError(f"{path}: tensor {name!r} has dtype {dt!r}; expected one of {sorted(DTYPE_SIZE)}")
        if not isinstance(shape, list) or len(shape) > 8 or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 40 for x in shape):
            raise FormatError(f"{path}: tensor {name!r} has shape {shape!r}; expected a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in offs)):
            raise FormatError(f"{path}: tensor {name!r} has data_offsets {offs!r}; expected [begin, end]")
        a, b = offs
        want = math.prod(shape) * DTYPE_SIZE[dt]
        if not (0 <= a <= b <= data_len) or b - a != want:
            raise FormatError(f"{path}: tensor {name!r}: data_offsets {offs} do not hold {want} bytes inside the {data_len}-byte data region")
        spans.append((a, b, name))
    spans.sort()
    pos = 0
    for a, b, name in spans:
        if a != pos:
            raise FormatError(f"{path}: tensor {name!r} starts at {a}; expected {pos} (tensors must tile the data region)")
        pos = b
    if pos != data_len:
        raise FormatError(f"{path}: {data_len - pos} bytes after the last tensor")
    return header, 8 + n, data_len


def read_tensor(path, meta, data_start):
    """One tensor as a float64 numpy array of its shape."""
    a, b = meta["data_offsets"]
    with open(path, "rb") as f:
        f.seek(data_start + a)
        raw = f.read(b - a)
    if len(raw) != b - a:
        raise FormatError(f"{path}: short read")
    if meta["dtype"] == "BF16":
        x = bf16_bits_to_f64(np.frombuffer(raw, dtype="<u2"))
    else:
        x = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise FormatError(f"{path}: a tensor holds NaN or infinity")
    return x.reshape(meta["shape"])


def write_safetensors(path, items):
    """items: list of (name, dtype, shape, raw bytes) in file order; written 0600."""
    header, off = {}, 0
    for name, dt, shape, raw in items:
        assert len(raw) == math.prod(shape) * DTYPE_SIZE[dt], name
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for item in items:
            f.write(item[3])


def _plain_file_name(s):
    return isinstance(s, str) and s and "/" not in s and "\\" not in s and s not in (".", "..") and "\0" not in s


def load_checkpoint(model_dir):
    """(KLConfig, {name: float64 numpy array}) after checking the folder against the exact
    inventory: every expected tensor present once, nothing extra, shapes and dtypes as the
    release has them, the index and the shard headers agreeing."""
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            cfg = KLConfig(json.load(f))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{model_dir}/config.json: cannot read ({e})")
    try:
        with open(os.path.join(model_dir, "model.safetensors.index.json"), encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{model_dir}/model.safetensors.index.json: cannot read ({e})")
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict):
        raise FormatError("model.safetensors.index.json: expected an object with a 'weight_map' object")
    shards = sorted(set(wm.values()), key=str)
    if len(shards) > MAX_SHARDS or not all(_plain_file_name(s) for s in shards):
        raise FormatError("model.safetensors.index.json: shard names must be plain file names (no folders)")
    want = expected_tensors(cfg)
    problems = []
    missing = [n for n in want if n not in wm]
    extra = [n for n in wm if n not in want]
    if missing:
        problems.append(f"missing {len(missing)} tensor(s), e.g. {missing[:5]}")
    if extra:
        problems.append(f"{len(extra)} unexpected tensor(s), e.g. {extra[:5]}")
    tensors = {}
    for shard in shards:
        path = os.path.join(model_dir, shard)
        header, start, _ = read_safetensors_header(path)
        for name, meta in header.items():
            if wm.get(name) != shard:
                problems.append(f"{shard} holds {name!r}, which the index places in {wm.get(name)!r}")
                continue
            if name not in want:
                continue
            shape, dt = want[name]
            if tuple(meta["shape"]) != shape or meta["dtype"] != dt:
                problems.append(f"{name}: {meta['dtype']}{meta['shape']}; expected {dt}{list(shape)}")
                continue
            tensors[name] = read_tensor(path, meta, start)
    absent = [n for n in want if n in wm and n not in tensors]
    if absent and not problems:
        problems.append(f"{len(absent)} indexed tensor(s) absent from their shard, e.g. {absent[:5]}")
    if problems:
        raise FormatError(f"{model_dir}: not the Kimi-Linear layout: " + "; ".join(problems))
    return cfg, tensors


def parameter_count(cfg):
    return sum(math.prod(s) for s, _ in expected_tensors(cfg).values())
