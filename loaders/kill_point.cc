#include "loaders/kill_point.h"

#include <signal.h>

#include <cstdlib>
#include <cstring>

namespace nibble {

void kill_point(const char* point) {
  const char* kill_at = std::getenv("NIBBLE_TEST_KILL_AT");
  if (kill_at && std::strcmp(kill_at, point) == 0) ::raise(SIGKILL);
  const char* stop_at = std::getenv("NIBBLE_TEST_STOP_AT");
  if (stop_at && std::strcmp(stop_at, point) == 0) ::raise(SIGSTOP);
}

}  // namespace nibble
