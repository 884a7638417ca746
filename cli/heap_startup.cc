#include "cli/heap_startup.h"

#include <cstdlib>  // defines __GLIBC__ where it is glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace nibble {

void keep_freed_buffers_for_reuse() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);             // no mmap()ed chunks: large buffers come from the heap too
  mallopt(M_TRIM_THRESHOLD, 1 << 30);  // ...and stay there when freed (up to 1 GiB free at the top)
#endif
}

}  // namespace nibble
