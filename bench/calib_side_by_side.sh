#!/bin/bash
# Calibrated quantization of one model side by side on one machine: two nibble binaries (BEFORE and AFTER,
# each with the calib/ scripts of its own tree) at their defaults (layer by layer), and AFTER's whole-model
# pass (--layer_by_layer off). Prints wall seconds and peak RSS per run, the report's stage seconds and
# calibration processes, and the SHA-256 of each output's data file.
#
#   bench/calib_side_by_side.sh MODEL.onnx CALIB.npz [ALGO] [REPEATS]     (BEFORE, AFTER: binaries;
#                                                                       AFTER defaults to build/nibble)
# The calibration npz of bench/compare (bench/compare_lib.py build_calib_npz: 32 x 256 tokens) is the
# issue's setting for SmolLM2.
set -euo pipefail
cd "$(dirname "$0")/.."
M=$1; NPZ=$2; ALGO=${3:-awq_lite}; REPEATS=${4:-1}
AFTER=${AFTER:-build/nibble}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/calibsbs.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
echo "load at start: $(cat /proc/loadavg); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
run() {
  local name=$1 bin=$2; shift 2
  rm -rf "$OUT/o"
  local t
  t=$(/usr/bin/time -f "%e s wall, peak RSS %M KB" "$bin" quantize --onnx_path "$M" --output_path "$OUT/o/model.onnx" \
      --algo "$ALGO" --calib_data "$NPZ" --quiet --report "$OUT/r.json" "$@" 2>&1 | tail -1)
  echo "$name: $t, $(.venv/bin/python -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; \
print('stages', {k: round(v, 1) for k, v in s['stage_seconds'].items()}, 'processes', \
s.get('calibration_processes', '-'))" "$OUT/r.json"), data $(cat "$OUT"/o/*.data | sha256sum | cut -c1-16)"
}
for i in $(seq "$REPEATS"); do
  [ -n "${BEFORE:-}" ] && run "before, default" "$BEFORE"
  run "after, default" "$AFTER"
  run "after, --layer_by_layer off" "$AFTER" --layer_by_layer off
done
echo "load at end: $(cat /proc/loadavg)"
