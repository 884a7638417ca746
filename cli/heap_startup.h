// Process start-up for the heap. nibble frees and allocates buffers of a tensor's size for every
// weight (codes, packed output, converted copies: tens to hundreds of MB). glibc serves such requests
// with fresh mmap()s and unmaps them on free(), so every tensor paid page faults and the kernel's
// zeroing of each page again: on the 32-layer 7B-shaped fp16 model that was ~3 s of system time of a
// ~14 s plain RTN run. Kept in the heap instead, a freed buffer is reused by the next tensor.
#pragma once

namespace nibble {

// Serve large allocations from the heap and never shrink it (glibc only; elsewhere a no-op). Peak RSS
// is that of the largest tensors held at once, as before; the heap is given back at exit.
void keep_freed_buffers_for_reuse();

}  // namespace nibble
