#!/usr/bin/env bash
# The one prepared device check for a machine with a GPU (issue 18): run it there, under 7
# minutes, and paste its output into docs/PERFORMANCE.md. Every step has its own time limit and
# says plainly when it cannot run, so a machine without a working Vulkan driver gives a clear
# answer instead of a hang.
#   tools/gpu-check.sh [BUILD_DIR]   (default build; configured and built here when missing)
# Steps: 1 the Vulkan driver (vulkaninfo --summary); 2 kernel microbenchmarks at K3 shapes
# (deltafin_gpu_bench: MXFP4 GEMV 3072x3584, BF16 GEMV 12288x7168, T=2048 GEMMs, the
# expert-grouped GEMM with its batches and the share of weight uploads made while the device
# computed; time, GB/s, TFLOPS, max error); 3 a K3-dimension synthetic model (make-model
# --preset k3, 2 layers): logits on the GPU against the CPU path (max difference, same greedy
# tokens; the prompt's MoE passes run their routed experts as grouped products), then bench
# prefill/decode on both (the `gpu prefill:` line: grouped products, expert bytes uploaded per
# pass, overlap).
# Environment: GPU (default auto; a device index to pick one), SKIP_BUILD=1, KEEP=1 (keep the
# model in $WORK), WORK (default a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
GPU=${GPU:-auto}
WORK=${WORK:-$(mktemp -d -t deltafin-gpu-check.XXXXXX)}
START=$(date +%s)
say() { printf '\n== %s (%ds)\n' "$*" $(( $(date +%s) - START )); }
cleanup() { [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK/k3" "$WORK/tiny" "$WORK"/logits-*.f32; }
trap cleanup EXIT

say "1. Vulkan driver"
if ! command -v vulkaninfo >/dev/null 2>&1; then
  echo "vulkaninfo is not installed (Debian: vulkan-tools); continuing without the summary"
else
  summary=$(timeout 60 vulkaninfo --summary 2>&1); rc=$?
  echo "$summary" | grep -E "apiVersion|driverName|deviceName|deviceType|driverInfo" || true
  if [ $rc -ne 0 ] || ! echo "$summary" | grep -q deviceName; then
    echo "NO VULKAN: the driver offers no Vulkan device (vulkaninfo exit $rc)."
    echo "An NVIDIA machine needs the proprietary driver's Vulkan ICD (nvidia_icd.json,"
    echo "libnvidia-gl / the Debian package nvidia-vulkan-icd) and libvulkan1."
    echo "$summary" | tail -5
    exit 1
  fi
  if ! echo "$summary" | grep -E "deviceType" | grep -qv CPU; then
    echo "Only a CPU Vulkan driver (lavapipe): --gpu auto would stay on the CPU; this check"
    echo "continues with device 0, the small kernel shapes and the tiny model (a dry run)."
    [ "$GPU" = auto ] && GPU=0
    SMALL=--small
  fi
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  say "build ($BUILD)"
  if [ ! -f "$BUILD/build.ninja" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  fi
  timeout 300 cmake --build "$BUILD" --target deltafin deltafin_gpu_bench -j "$(nproc)" | tail -2 ||
    { echo "build failed"; exit 1; }
fi
BIN="$BUILD/src/cli/deltafin"
KBENCH="$BUILD/bench/deltafin_gpu_bench"
for f in "$BIN" "$KBENCH"; do
  [ -x "$f" ] || { echo "missing $f (build the deltafin and deltafin_gpu_bench targets)"; exit 1; }
done

say "2. kernels at K3 shapes (GPU $GPU)"
timeout 150 "$KBENCH" --gpu "$GPU" --reps "${SMALL:+1}${SMALL:-5}" ${SMALL:-}; rc=$?
case $rc in
  0) ;;
  3) echo "no GPU chosen (see the line above): nothing to measure"; exit 1 ;;
  124) echo "kernel benchmarks passed their 150 s limit" ;;
  *) echo "kernel benchmarks failed (exit $rc)" ;;
esac

MODEL="$WORK/k3"
if [ -n "${SMALL:-}" ]; then
  say "3. tiny model (CPU driver): GPU path against CPU path"
  MODEL="$WORK/tiny"
  SHAPE=(--preset tiny)
else
  say "3. K3-dimension model: GPU against CPU"
  SHAPE=(--preset k3 --layers 2 --dense-layers 1 --experts 16 --top-k 4)
fi
if [ ! -f "$MODEL/config.json" ]; then
  timeout 120 "$BIN" make-model "${SHAPE[@]}" --quiet "$MODEL" ||
    { echo "make-model failed or passed 120 s"; exit 1; }
fi
TOKENS=$(seq -s, 100 3 400)  # 101 prompt tokens (ids < 512: valid in every preset)
for dev in off "$GPU"; do
  timeout 120 "$BIN" logits --model "$MODEL" --mmap --gpu "$dev" --tokens "$TOKENS" \
    --mode split:96 --out "$WORK/logits-$dev.f32" 2>&1 | grep -E "^\[gpu\]|rror" ||
    true
done
if command -v python3 >/dev/null 2>&1 && [ -f "$WORK/logits-off.f32" ] && [ -f "$WORK/logits-$GPU.f32" ]; then
  python3 - "$WORK/logits-off.f32" "$WORK/logits-$GPU.f32" "$MODEL/config.json" <<'PY'
import json, struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
cfg = json.load(open(sys.argv[3])); V = cfg.get("text_config", cfg)["vocab_size"]
n = len(a) // 4
x = struct.unpack(f"<{n}f", a); y = struct.unpack(f"<{n}f", b)
worst = max(abs(p - q) for p, q in zip(x, y))
rows = n // V
same = sum(1 for r in range(rows)
           if max(range(V), key=lambda i: x[r * V + i]) == max(range(V), key=lambda i: y[r * V + i]))
print(f"logits: {rows} rows, max |gpu - cpu| = {worst:.3e}; greedy token equal on {same}/{rows} rows")
PY
else
  echo "cannot compare the logits (python3 or an output file is missing)"
fi
for dev in off "$GPU"; do
  echo "-- bench --gpu $dev"
  timeout 150 "$BIN" bench --model "$MODEL" --mmap --gpu "$dev" --prompt-tokens "${SMALL:+32}${SMALL:-512}" \
    --gen-tokens 8 --reps 1 --no-disk-probe 2>&1 | grep -E "^(gpu|prefill|decode|model|machine)" ||
    echo "bench --gpu $dev failed or passed 150 s"
done
say "done"
