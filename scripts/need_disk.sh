# Sourced by the test scripts: stop with one line when a folder the tests write to has too little free
# space. The e2e suite writes models of up to a few GB under pytest's temporary folder; with a nearly
# full disk it fails hundreds of tests at setup, each with a long traceback that hides the cause.
#   need_disk NAME FOLDER GIB
need_disk() {
  local name=$1 folder=$2 need_gib=$3 free_kib
  free_kib=$(df -Pk "$folder" | awk 'NR == 2 { print $4 }')
  if [ "$free_kib" -lt $((need_gib * 1024 * 1024)) ]; then
    echo "$name: only $((free_kib / 1024 / 1024)) GiB free under $folder; the tests need about $need_gib GiB" \
         "(free some space, or point TMPDIR elsewhere)" >&2
    exit 1
  fi
}
