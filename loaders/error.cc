#include "loaders/error.h"

#include <cstring>

namespace nibble {

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace nibble
