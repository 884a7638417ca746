#!/usr/bin/env bash
# awq_learned beside awq_gptq on one model, the same calibration tokens and evaluation windows:
#   bench/learned_side_by_side.sh MODEL_DIR WORK [SAMPLES=64] [SEQ_LEN=256] [WINDOWS=128]
# MODEL_DIR: an ORT-GenAI folder (model.onnx, tokenizer.json), e.g. build/e2e-cache/smollm2-fp32-*.
# Prints each run's wall time, CPU time and peak RSS, then the paired perplexities (bench/paired_ppl.py):
# float against each method, and awq_learned against awq_gptq, with the share of awq_gptq's gap to the
# float model that awq_learned closes (in mean NLL). Run it on a quiet machine: the times are compared.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model_dir=$1 work=$2 samples=${3:-64} seq_len=${4:-256} windows=${5:-128}
py="$root/.venv/bin/python"
mkdir -p "$work"
calib="$work/calib_${samples}x${seq_len}.npz"
(cd "$root/bench" && "$py" -c "import compare_lib as cl, sys; cl.build_calib_npz(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])" \
  "$model_dir" "$samples" "$seq_len" "$calib")
for algo in awq_gptq awq_learned; do
  /usr/bin/time -f "$algo: %e s wall, %U s user, %M KB peak RSS" "$root/build/nibble" quantize \
    --onnx_path "$model_dir/model.onnx" --output_path "$work/$algo/model.onnx" --algo "$algo" --force --quiet \
    --calib_data "$calib" --calib_size "$samples" --calib_seq_len "$seq_len" --report "$work/$algo.json"
done
for side in float awq_gptq awq_learned; do
  src=$([ "$side" = float ] && echo "$model_dir" || echo "$work/$side")
  "$py" "$root/tools/eval_ppl.py" "$src/model.onnx" --windows "$windows" > "$work/ppl_$side.json"
done
for pair in "float awq_gptq" "float awq_learned" "awq_gptq awq_learned"; do
  set -- $pair
  python3 "$root/bench/paired_ppl.py" "$work/ppl_$1.json" "$work/ppl_$2.json" --names "$1" "$2"
done
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
nll = {s: json.load(open(f"{w}/ppl_{s}.json"))["window_nll"] for s in ("float", "awq_gptq", "awq_learned")}
m = {s: sum(v) / len(v) for s, v in nll.items()}
print(f"awq_learned closes {(m['awq_gptq'] - m['awq_learned']) / (m['awq_gptq'] - m['float']):.1%} of awq_gptq's gap to float")
print("learned_rounding:", json.load(open(f"{w}/awq_learned.json"))["summary"]["learned_rounding"])
PY
