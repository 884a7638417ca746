#!/bin/bash
# The default RTN on the 32-layer Llama-2-7B-shaped fp16 model (13.48 GB), side by side on one machine:
# nibble's default rtn_dq, its plain RTN (--awq_mode modelopt), the default with --threads 1 (the bytes
# must not change) and ONNX Runtime's symmetric RTN, each run after `cat` warmed the page cache with the
# input, output deleted between runs. Prints wall / user / sys seconds and peak RSS per run, the SHA-256 of
# each nibble output (data file) and the GB/s its reads reached (the report's summary.read_gbps); and, to
# compare them with, the warm `cat` of the data file and a warm read of it by one `dd` per core.
#
#   bench/rtn_7b_side_by_side.sh [MODEL_DIR] [REPEATS]        (NIBBLE_BIN: the binary, default build/nibble)
#   SKIP_ORT=1 ...   to leave ONNX Runtime out (60 s and 17 GB of RAM per run)
#
# The model is made by tools/make_llama_shaped.py if MODEL_DIR has none (about 2 min, 13.5 GB of disk).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/l7b}
REPEATS=${2:-2}
BIN=${NIBBLE_BIN:-build/nibble}
M=$DIR/model.onnx
OUT=$(mktemp -d "${TMPDIR:-/tmp}/rtn7b.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
[ -f "$M" ] || .venv/bin/python tools/make_llama_shaped.py --quiet --out "$M"
echo "load at start: $(cat /proc/loadavg); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} (no RTN here reads BLAS)"
warm() { /usr/bin/time -f "%e" cat "$M.data" 2>&1 >/dev/null | tail -1; }
echo "cat of the data file (warm): $(warm) s"
# One dd per core, each reading its slice in 4 MiB blocks: what several threads get from the page cache.
ddn() {
  local n size; n=$(nproc); size=$(stat -c %s "$M.data")
  /usr/bin/time -f "%e" bash -c "for i in \$(seq 0 $((n - 1))); do
      dd if='$M.data' of=/dev/null bs=4M iflag=skip_bytes,count_bytes status=none \\
         skip=\$((i * ($size / $n))) count=\$(( i == $n - 1 ? $size - i * ($size / $n) : $size / $n )) &
    done; wait" 2>&1 | tail -1
}
t=$(ddn); echo "dd x $(nproc) of the data file (warm): $t s, $(awk -v b="$(stat -c %s "$M.data")" -v t="$t" 'BEGIN{printf "%.2f", b/t/1e9}') GB/s"
run() {
  local name=$1; shift
  warm >/dev/null
  rm -rf "$OUT/o"; mkdir -p "$OUT/o"
  local t
  t=$(/usr/bin/time -f "%e s wall, %U user, %S sys, peak RSS %M KB" "$@" 2>&1 | tail -1)
  local sha=""
  case "$name" in nibble*) sha="  data sha256 $(cat "$OUT"/o/*.data | sha256sum | cut -c1-16), read $(.venv/bin/python -c \
    "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print(f\"{s.get('read_gbps', 0):.2f} GB/s\")" "$OUT/r.json")";; esac
  echo "$name: $t$sha"
}
nib() { run "$1" "$BIN" quantize --onnx_path "$M" --output_path "$OUT/o/model.onnx" --algo rtn_dq --quiet --report "$OUT/r.json" "${@:2}"; }
for i in $(seq "$REPEATS"); do
  nib "nibble default"
  nib "nibble plain (--awq_mode modelopt)" --awq_mode modelopt
done
nib "nibble default --threads 1" --threads 1
if [ -z "${SKIP_ORT:-}" ]; then
  run "ORT RTN symmetric" .venv-ortq/bin/python bench/run_ort_quantizer.py --onnx_path "$M" \
      --output_path "$OUT/o/model.onnx" --block_size 128 --symmetric
fi
echo "load at end: $(cat /proc/loadavg)"
