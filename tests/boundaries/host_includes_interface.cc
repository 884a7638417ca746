// Must compile: the control case, host code including the kernel interface it links.
#include "kernels/backend.h"
#include "host/run/stages.h"

int main() { return 0; }
