#!/bin/sh
# Fails when a CUDA kernel launch names no stream. Every kernel must run on the device layer's compute
# stream (kernels/cuda/device.h): that stream is non-blocking, so a launch on the legacy default stream
# runs unordered beside the BLAS calls and kernels it depends on. A GPU shows that only as results
# that change from run to run; this source check shows it without one.
# A launch's configuration <<<grid, block, shared bytes, stream>>> has three commas.
root="$1"
out=$(find "$root/kernels" \( -name '*.cu' -o -name '*.h' -o -name '*.cuh' \) -print0 | xargs -0 perl -0777 -ne '
  while (/<<<(.*?)>>>/sg) {
    my $cfg = $1; my $n = () = $cfg =~ /,/g;
    print "$ARGV: <<<$cfg>>>\n" if $n < 3;
  }')
launches=$(find "$root/kernels" \( -name '*.cu' -o -name '*.h' -o -name '*.cuh' \) -print0 | xargs -0 cat | grep -c '<<<')
[ "$launches" -gt 0 ] || { echo "no kernel launches found under $root/kernels"; exit 1; }
if [ -n "$out" ]; then
  echo "kernel launches without a stream:"
  echo "$out"
  exit 1
fi
echo "$launches kernel launches, each on a named stream"
