#!/bin/sh
# Compile launcher of the CUDA library: runs the compile command and keeps what ptxas says about
# each kernel (-Xptxas -v: registers, stack, spill stores and loads) in OBJECT.ptxas.log, read by
# tests/check_spills.sh. Everything else nvcc prints goes to the build output as usual.
obj=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && obj="$a"
  prev="$a"
done
log="${obj:-/dev/null}.ptxas.log"
"$@" 2>"$log.tmp"
rc=$?
grep -v -e "^ptxas info" -e "^    [0-9]* bytes stack frame, " "$log.tmp" >&2
mv "$log.tmp" "$log"
exit $rc
