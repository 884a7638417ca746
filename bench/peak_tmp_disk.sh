#!/usr/bin/env bash
# Peak temporary disk of one quantize run: TMPDIR (a fresh folder) and the layer state folder beside the
# output, sampled with `du -sb` every 0.2 s, and the output data finally written; peak RSS, the layer pass
# and the stage seconds from the run's report. Any flags after the output folder go to nibble.
#   bench/peak_tmp_disk.sh MODEL.onnx OUTDIR [FLAGS...]      (NIBBLE=path/to/nibble, default build/nibble)
set -u
model=$1; out=$2; shift 2
nibble=${NIBBLE:-$(dirname "$0")/../build/nibble}
tmp=$out.tmp; rm -rf "$tmp" "$out"; mkdir -p "$tmp" "$out"
TMPDIR=$tmp "$nibble" quantize --onnx_path "$model" --output_path "$out/model.onnx" --quiet --report "$out.json" "$@" &
pid=$!; peak_tmp=0; peak_state=0
while kill -0 $pid 2>/dev/null; do
  t=$(du -sb "$tmp" 2>/dev/null | cut -f1); s=$(du -sb "$out/.model.onnx.layers" 2>/dev/null | cut -f1)
  [ "${t:-0}" -gt $peak_tmp ] && peak_tmp=${t:-0}
  [ "${s:-0}" -gt $peak_state ] && peak_state=${s:-0}
  sleep 0.2
done
wait $pid; rc=$?
echo "rc $rc peak_TMPDIR_bytes $peak_tmp peak_state_folder_bytes $peak_state output_bytes $(du -sb "$out" | cut -f1)"
python3 -c "import json, sys; s = json.load(open(sys.argv[1]))['summary']
print('peak_rss_bytes', s['peak_rss_bytes'], 'seconds', round(s['seconds'], 1), s.get('layer_pass'), s.get('stage_seconds'))" "$out.json"
rm -rf "$tmp"
exit $rc
