#!/bin/sh
# Gives the built-in demo (assets/demo/k3-demo.tar.gz) its vision tower, reproducibly: the
# shipped archive is unpacked, `deltafin make-model --vision demo` writes a random tower and
# projector of the released structure whose projector width is the demo's hidden size (96) and
# whose media placeholder is the demo tokenizer's <|media_pad|> (vocabulary 1,280: id 1045),
# and tools/pack_demo.py packs the demo's own text files byte for byte plus the tower's shard,
# the rewritten config and index, and preprocessor_config.json. The text weights are trained
# (tools/train) and cannot be regenerated bit for bit, so they come from the archive itself; the
# tower is a pure function of make-model's seed, so running this twice gives the same archive.
# The script refuses to finish if any text shard, the tokenizer or the drafter changed.
#
#   tools/demo_vision.sh [DELTAFIN_BINARY]     (default build/src/cli/deltafin)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/src/cli/deltafin}
archive=$root/assets/demo/k3-demo.tar.gz
[ -x "$bin" ] || { echo "demo_vision.sh: no deltafin binary at $bin (build it, or pass its path)" >&2; exit 2; }
work=$(mktemp -d /tmp/deltafin-demo-vision.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/demo" "$work/after"
tar xzf "$archive" -C "$work/demo"

# The tower: the demo preset (D 32, 2 layers, 16x16 position grid; ~81 K parameters), seed 1.
# The text half make-model writes beside it is thrown away (only vision tensors are taken).
"$bin" make-model "$work/vision" --preset tiny --hidden 96 --vocab 1280 --layers 2 \
  --vision demo --seed 1 --no-tokenizer --quiet

about=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["about"])' "$work/demo/demo.json")
drafter=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["drafter"])' "$work/demo/demo.json")
/usr/bin/python3 "$root/tools/pack_demo.py" "$work/demo" --draft "$work/demo/draft" --about "$about" \
  --drafter "$drafter" --vision "$work/vision" --patch-limit 1024 --side-limit 64 \
  --vision-about "its vision tower and projector are random, not trained (81 K parameters, the released structure at D 32, an image downscaled to about 1,024 patches, some 256 tokens): it accepts images but cannot tell what is in them" \
  --out "$work/k3-demo.tar.gz"

# Everything the text model and the drafter read is unchanged.
tar xzf "$work/k3-demo.tar.gz" -C "$work/after"
for f in $(cd "$work/demo" && ls model-0*.safetensors) tiktoken.model tokenizer_config.json \
  generation_config.json $(cd "$work/demo" && ls -d draft/*); do
  cmp -s "$work/demo/$f" "$work/after/$f" || { echo "demo_vision.sh: $f changed" >&2; exit 1; }
done
cp "$work/k3-demo.tar.gz" "$archive"
ls -l "$archive"
