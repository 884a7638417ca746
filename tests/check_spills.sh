#!/bin/sh
# Fails when any CUDA kernel spills registers: reads the ptxas resource usage that the build kept
# beside each object of the CUDA library (cmake/ptxas_log.sh), and prints cuobjdump's view of the
# library too when the toolkit has cuobjdump.
dir="$1"
lib="$2"
logs=$(find "$dir" -name '*.ptxas.log')
[ -n "$logs" ] || { echo "no ptxas logs under $dir: build the CUDA library first"; exit 1; }
kernels=$(cat $logs | grep -c "Used [0-9]* registers")
[ "$kernels" -gt 0 ] || { echo "no kernel resource usage in the ptxas logs"; exit 1; }
spills=$(cat $logs | grep -E "[1-9][0-9]* bytes spill (stores|loads)")
if command -v cuobjdump >/dev/null 2>&1 && [ -n "$lib" ]; then cuobjdump --dump-resource-usage "$lib" | head -50; fi
if [ -n "$spills" ]; then
  echo "register spills:"
  echo "$spills"
  exit 1
fi
echo "$kernels kernel compilations (all architectures), none spills registers"
