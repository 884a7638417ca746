#!/usr/bin/env bash
# Calibration on nibble's layer engine beside ONNX Runtime's, on one model, the same calibration tokens:
#   bench/engine_side_by_side.sh MODEL_DIR WORK [SAMPLES=32] [SEQ_LEN=256] [WINDOWS=64] [ALGO=awq_lite] [EXTRA FLAGS...]
# MODEL_DIR: an ORT-GenAI folder (model.onnx, tokenizer.json), e.g. build/e2e-cache/smollm2-fp32-*.
# Every flag at its default but the calibration data and --calibration_engine (and one ONNX Runtime run with
# --layer_by_layer off, the whole-model pass, for the time it takes). Prints each run's wall
# time, peak RSS and stage seconds (the layer engine's forward and statistics seconds, its products' GFLOP
# and rate, beside the machine's sgemm rate through the same BLAS: bench/sgemm_rate.py), then the paired
# perplexity of the two outputs (bench/paired_ppl.py). Run it on a quiet machine: the times are compared.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model_dir=$1 work=$2 samples=${3:-32} seq_len=${4:-256} windows=${5:-64} algo=${6:-awq_lite}
shift $(( $# < 6 ? $# : 6 ))
py="$root/.venv/bin/python"
mkdir -p "$work"
calib="$work/calib_${samples}x${seq_len}.npz"
(cd "$root/bench" && "$py" -c "import compare_lib as cl, sys; cl.build_calib_npz(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])" \
  "$model_dir" "$samples" "$seq_len" "$calib")
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" "$root/bench/sgemm_rate.py" "$root/build/nibble" --seconds 2  # the yardstick of the engine's GFLOP/s
for run in ort ort_whole native; do
  engine=${run%_whole}
  pass=$([ "$run" = ort_whole ] && echo off || echo auto)
  /usr/bin/time -f "$run: %e s wall, %U s user, %M KB peak RSS (largest process)" "$root/build/nibble" quantize \
    --onnx_path "$model_dir/model.onnx" --output_path "$work/$run/model.onnx" --algo "$algo" --force --quiet \
    --calib_data "$calib" --calib_size "$samples" --calib_seq_len "$seq_len" --calibration_engine "$engine" \
    --layer_by_layer "$pass" --report "$work/$run.json" "$@"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print('  stage_seconds', {k: round(v, 1) for k, v in s['stage_seconds'].items()}, 'peak_rss_MiB', round(s['peak_rss_bytes'] / 2**20), s.get('calibration_engine', ''))" "$work/$run.json"
done
[ "$windows" -gt 0 ] || exit 0
for engine in ort native; do
  "$py" "$root/tools/eval_ppl.py" "$work/$engine/model.onnx" --windows "$windows" > "$work/ppl_$engine.json"
done
python3 "$root/bench/paired_ppl.py" "$work/ppl_ort.json" "$work/ppl_native.json" --names ort native
