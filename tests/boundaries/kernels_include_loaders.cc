// Must NOT compile: the kernels know no files or graphs.
#include "loaders/onnx_model.h"

int main() { return 0; }
