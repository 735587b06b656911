#!/bin/bash
# llama.cpp beside Deltafin on the same weights and threads: the yardstick docs/PERFORMANCE.md
# quotes ("prefill side by side with llama.cpp"). A development tool; nothing in the build or
# the tests uses it.
#
#   tools/llamacpp-yardstick.sh build
#       Builds llama.cpp's llama-bench for this CPU (native ISA flags) in $LLAMACPP_DIR, and
#       llamacpp-logits (tools/llamacpp/logits.cpp) against its library.
#   tools/llamacpp-yardstick.sh convert MODEL_DIR OUT.gguf [bf16|f32]
#       Writes a checkpoint in the release layout (`deltafin make-model` output, the golden
#       models in tests/data) as GGUF with llama.cpp's own converter: K3 (llama.cpp's kimi-k3),
#       Kimi-Linear (kimi-linear) or DeepseekV3ForCausalLM (deepseek2). The trunk becomes the
#       given type; K3's routed experts stay MXFP4, so both engines read the same weights. An
#       FP8 or INT4 checkpoint (K2, K2-Thinking) is first copied as float32
#       (tools/llamacpp/dequantize.py: the float32 weights Deltafin's kernels dequantise to), so
#       convert it with f32.
#   tools/llamacpp-yardstick.sh compare MODEL_DIR OUT.gguf [ROUNDS]
#       ROUNDS (default 3) interleaved rounds of `deltafin bench` and `llama-bench` (prompt
#       $PROMPT tokens, $GEN generated, $THREADS threads, $REPS repetitions each) and one table
#       line per round: prefill and decode tokens/s of both and their ratios. Interleaving
#       matters on a shared machine: compare the ratios of one round, not runs from different
#       times.
#   tools/llamacpp-yardstick.sh logits MODEL_DIR F32.gguf [BF16.gguf]
#       The logits of both engines for $COUNT token ids (seeded, ordinary ids below 32000) in each mode
#       (prefill, decode, split:N), llama.cpp's with a float32 KV cache. With F32.gguf (convert
#       ... f32) llama.cpp's products keep float32 activations as Deltafin's do, so the two must
#       agree to float32 rounding; BF16.gguf (the same weights, products with BF16 activations)
#       measures llama.cpp's own precision, the bar Deltafin's difference must stay under. Prints
#       max |difference|, its share of the largest logit, greedy agreement, and PASS or FAIL.
#
# Environment: LLAMACPP_DIR (work folder, default ~/.cache/deltafin/llamacpp), DELTAFIN (the
# binary, default build/src/cli/deltafin), THREADS (2), PROMPT (256), GEN (16), REPS (3),
# LLAMACPP_NPM_VERSION (the node-llama-cpp release whose llama.cpp is built, default 3.22.1),
# COUNT (logits: token ids, default 24), SEED (logits: 7).
#
# Why these sources: Debian 12 has no llama.cpp package. The npm package node-llama-cpp ships a
# git bundle of the llama.cpp source it binds, and its 3.22.1 release carries a llama.cpp with
# Kimi K3 support; npm is reachable where the project builds. The converter runs on Debian's
# python3-torch, which predates some dtypes the converter names; they are aliased to
# placeholders it never uses for these checkpoints. The checkpoints' tokenizers are not
# converted: the GGUF gets a placeholder vocabulary of the right size, so compare speed and
# token ids, never text.
#
# What to expect: llama.cpp rounds activations before its quantized products (BF16 for the
# trunk, Q8_0 for MXFP4 experts) where Deltafin keeps float32, so greedy tokens mostly agree
# and logits do not.
set -euo pipefail

WORK=${LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/deltafin/llamacpp}
NPM_VERSION=${LLAMACPP_NPM_VERSION:-3.22.1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DELTAFIN=${DELTAFIN:-$ROOT/build/src/cli/deltafin}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-256}
GEN=${GEN:-16}
REPS=${REPS:-3}
COUNT=${COUNT:-24}
SEED=${SEED:-7}
BENCH=$WORK/build/bin/llama-bench
LOGITS=$WORK/build/bin/llamacpp-logits
# Debian's interpreter, which sees the python3-* packages apt installs (a python3 earlier on PATH,
# pyenv's say, would not).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
}

need() {  # need COMMAND DEBIAN-PACKAGE...
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "installing $*" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${@:2}" >/dev/null
}

build_logits() {
  [ -x "$LOGITS" ] && [ "$LOGITS" -nt "$ROOT/tools/llamacpp/logits.cpp" ] && return
  c++ -O2 -std=c++17 -I "$WORK/src/include" -I "$WORK/src/ggml/include" \
    "$ROOT/tools/llamacpp/logits.cpp" -L "$WORK/build/bin" -lllama -lggml -lggml-base \
    -Wl,-rpath,"$WORK/build/bin" -o "$LOGITS"
  echo "llamacpp-logits built: $LOGITS"
}

build() {
  if [ -x "$BENCH" ]; then
    echo "llama-bench already built: $BENCH"
    build_logits
    return
  fi
  need npm nodejs npm
  need git git
  need cmake cmake
  need ninja ninja-build
  mkdir -p "$WORK/npm"
  local pkg="$WORK/npm/node-llama-cpp-$NPM_VERSION.tgz"
  [ -f "$pkg" ] || (cd "$WORK/npm" && npm pack --silent "node-llama-cpp@$NPM_VERSION" >/dev/null)
  rm -rf "$WORK/npm/package" "$WORK/src"
  tar -xzf "$pkg" -C "$WORK/npm"
  local bundle="$WORK/npm/package/llama/gitRelease.bundle"
  [ -f "$bundle" ] || { echo "node-llama-cpp $NPM_VERSION has no llama.cpp source bundle" >&2; exit 1; }
  git -c advice.detachedHead=false clone --quiet "$bundle" "$WORK/src"
  cmake -S "$WORK/src" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    >/dev/null
  cmake --build "$WORK/build" -j "$(nproc)" --target llama-bench llama >/dev/null
  echo "llama-bench built: $BENCH"
  build_logits
}

convert() {
  [ $# -ge 2 ] || usage
  local model=$1 out=$2 type=${3:-bf16}
  [ -d "$WORK/src" ] || { echo "no llama.cpp source in $WORK: run '$0 build' first" >&2; exit 1; }
  [ -f "$model/config.json" ] || { echo "$model: no config.json (expected a checkpoint folder)" >&2; exit 1; }
  if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    echo "installing python3-torch python3-numpy python3-tqdm" >&2
    apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch python3-numpy python3-tqdm >/dev/null
  fi
  # The converter imports transformers only for tokenizers and configs it is not asked for
  # here: an empty module stands in for it.
  mkdir -p "$WORK/shim/transformers"
  cat >"$WORK/shim/transformers/__init__.py" <<'PY'
class _Absent:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise RuntimeError("transformers is not used by the yardstick's conversion")
AutoConfig = AutoTokenizer = _Absent
PY
  # FP8 and INT4 checkpoints (K2, DeepSeek-V3, K2-Thinking as released) go through a float32
  # copy: the converter's dequantisation does not run on Debian 12's torch (no float8 type; its
  # INT4 unpacking fails on lazy tensors).
  local copy=""
  if "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); q = c.get("quantization_config") or {}; sys.exit(q.get("quant_method") not in ("fp8", "compressed-tensors"))' "$model/config.json"; then
    copy=$(mktemp -d "${out}.as-f32.XXXXXX")
    # shellcheck disable=SC2064 # expanded now: `copy` is local, gone when the trap runs
    trap "rm -rf '$copy'" EXIT
    "$PY" "$ROOT/tools/llamacpp/dequantize.py" "$model" "$copy/model"
    model=$copy/model
  fi
  SRC="$WORK/src" SHIM="$WORK/shim" "$PY" - "$model" "$out" "$type" <<'PY'
import os
import sys

model, out, outtype = sys.argv[1:4]
src = os.environ["SRC"]
sys.path[:0] = [os.environ["SHIM"], src, os.path.join(src, "gguf-py")]

import torch

# Debian 12's torch lacks these dtypes; the converter only names them (MXFP4 is repacked from
# the raw bytes), so any byte-sized placeholder will do.
for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float8_e8m0fnu", "float4_e2m1fn_x2"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)
for name, same_width in (("uint16", torch.int16), ("uint32", torch.int32), ("uint64", torch.int64)):
    if not hasattr(torch, name):
        setattr(torch, name, same_width)

import gguf
import json

# llama.cpp's converter class for the checkpoint's architecture: K3 (kimi-k3), Kimi-Linear
# (kimi-linear) and the DeepSeek-V3 layout K2 and DeepSeek-V3 use (its deepseek2 architecture).
arch = json.load(open(os.path.join(model, "config.json")))["architectures"][0]
if arch == "KimiK3ForConditionalGeneration":
    from conversion.kimi_k3 import KimiK3Model as Converter
elif arch == "KimiLinearForCausalLM":
    from conversion.kimi_linear import KimiLinearModel as Converter
elif arch == "DeepseekV3ForCausalLM":
    from conversion.deepseek import DeepseekV2Model as Converter
else:
    sys.exit(f"{model}: architecture {arch} has no llama.cpp converter wired in here "
             "(KimiK3ForConditionalGeneration, KimiLinearForCausalLM, DeepseekV3ForCausalLM)")


def placeholder_vocab(self):
    n = self.hparams["vocab_size"]
    w = self.gguf_writer
    w.add_tokenizer_model("none")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"<id{i}>" for i in range(n)])
    w.add_token_types([gguf.TokenType.NORMAL] * n)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


Converter.set_vocab = placeholder_vocab

import convert_hf_to_gguf

sys.argv = ["convert_hf_to_gguf", model, "--outfile", out, "--outtype", outtype]
convert_hf_to_gguf.main()
PY
  echo "wrote $out"
}

# One field of a JSON document on stdin, by a Python expression over `j`.
field() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }

compare() {
  [ $# -ge 2 ] || usage
  local model=$1 gguf=$2 rounds=${3:-3}
  [ -x "$BENCH" ] || { echo "no llama-bench in $WORK: run '$0 build' first" >&2; exit 1; }
  [ -x "$DELTAFIN" ] || { echo "no deltafin binary at $DELTAFIN (set DELTAFIN)" >&2; exit 1; }
  echo "model $model; $THREADS threads; prompt $PROMPT, $GEN generated, $REPS reps; $(lscpu | sed -n 's/^Model name: *//p')"
  printf '%-6s %-14s %-14s %-8s %-14s %-14s %-8s\n' round "llama pp t/s" "deltafin pp" ratio \
    "llama tg t/s" "deltafin tg" ratio
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  for ((r = 1; r <= rounds; ++r)); do
    "$BENCH" -m "$gguf" -t "$THREADS" -p "$PROMPT" -n "$GEN" -r "$REPS" -o json >"$TMP/llama.json" 2>/dev/null
    "$DELTAFIN" bench --model "$model" --threads "$THREADS" --prompt-tokens "$PROMPT" \
      --gen-tokens "$GEN" --reps "$REPS" --no-disk-probe --json >"$TMP/deltafin.json" 2>/dev/null
    local lpp ltg dpp dtg
    lpp=$(field "next(t['avg_ts'] for t in j if t['n_prompt'] > 0 and t['n_gen'] == 0)" <"$TMP/llama.json")
    ltg=$(field "next(t['avg_ts'] for t in j if t['n_gen'] > 0 and t['n_prompt'] == 0)" <"$TMP/llama.json")
    dpp=$(field "j['prefill_tokens_per_s']" <"$TMP/deltafin.json")
    dtg=$(field "j['decode_tokens_per_s']" <"$TMP/deltafin.json")
    printf '%-6s %-14.2f %-14.2f %-8.2f %-14.2f %-14.2f %-8.2f\n' "$r" "$lpp" "$dpp" \
      "$(python3 -c "print($dpp / $lpp)")" "$ltg" "$dtg" "$(python3 -c "print($dtg / $ltg)")"
  done
}

logits() {
  [ $# -ge 2 ] || usage
  local model=$1 f32=$2 bf16=${3:-}
  [ -x "$BENCH" ] || { echo "no llama.cpp build in $WORK: run '$0 build' first" >&2; exit 1; }
  [ -x "$DELTAFIN" ] || { echo "no deltafin binary at $DELTAFIN (set DELTAFIN)" >&2; exit 1; }
  build_logits >&2
  local ids split top
  # Ordinary ids: below the last 256 (the specials; a tiny test vocabulary: all) and 32000.
  top=$("$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c = c.get("text_config", c); v = c["vocab_size"]; print(min(32000, v - 256 if v > 512 else v))' "$model/config.json")
  ids=$("$PY" -c "import random; r = random.Random($SEED); print(','.join(str(r.randrange($top)) for _ in range($COUNT)))")
  split=$((COUNT / 2))
  echo "model $model; $COUNT ids (seed $SEED); $THREADS threads; $(lscpu | sed -n 's/^Model name: *//p')"
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  for mode in prefill decode "split:$split"; do
    "$DELTAFIN" logits --model "$model" --mmap --threads "$THREADS" --tokens "$ids" --mode "$mode" \
      --out "$TMP/deltafin-$mode.bin" >/dev/null
    "$LOGITS" "$f32" "$ids" "$mode" "$THREADS" "$TMP/f32-$mode.bin" >/dev/null 2>"$TMP/llama.log" ||
      { cat "$TMP/llama.log" >&2; exit 1; }
    if [ -n "$bf16" ]; then
      "$LOGITS" "$bf16" "$ids" "$mode" "$THREADS" "$TMP/bf16-$mode.bin" >/dev/null 2>"$TMP/llama.log" ||
        { cat "$TMP/llama.log" >&2; exit 1; }
    fi
  done
  "$PY" - "$TMP" "$COUNT" "$split" "$bf16" <<'PY'
import sys
import numpy as np

tmp, count, split, bf16 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


def load(name):
    a = np.fromfile(f"{tmp}/{name}.bin", dtype=np.float32)
    if a.size % count:
        sys.exit(f"{name}: {a.size} floats is not {count} rows")
    return a.reshape(count, -1).astype(np.float64)


def line(label, x, y):
    d = np.abs(x - y).max()
    agree = int((x.argmax(1) == y.argmax(1)).sum())
    print(f"{label:<36} {d:<12.3g} {d / np.abs(y).max():<12.3g} {agree}/{count}")
    return d, agree


print(f"{'mode: pair':<36} {'max |diff|':<12} {'/ max|logit|':<12} greedy")
ok = True
for mode in ("prefill", "decode", f"split:{split}"):
    ours, f32 = load(f"deltafin-{mode}"), load(f"f32-{mode}")
    d, agree = line(f"{mode}: deltafin vs llama.cpp f32", ours, f32)
    if bf16:
        own, _ = line(f"{mode}: llama.cpp bf16 vs f32", load(f"bf16-{mode}"), f32)
        ok &= d < own
    ok &= d <= 1e-4 * np.abs(f32).max() and agree == count
print("PASS: Deltafin agrees with llama.cpp's float32 products to float32 rounding"
      + (", far inside llama.cpp's own BF16 precision" if bf16 else "") if ok else
      "FAIL: the engines disagree beyond float32 rounding")
sys.exit(0 if ok else 1)
PY
}

case "${1:-}" in
build) build ;;
logits) shift && logits "$@" ;;
convert) shift && convert "$@" ;;
compare) shift && compare "$@" ;;
*) usage ;;
esac
