// Must NOT compile: host code reaches the kernels only through kernels/backend.h, so a host library
// does not see kernels/cpu's headers (tests/boundaries/README.md).
#include "kernels/cpu/rtn_ref.h"

int main() { return 0; }
