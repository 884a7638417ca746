// Must NOT compile: calibration measures and knows nothing of the host's stages or options.
#include "host/options.h"

int main() { return 0; }
