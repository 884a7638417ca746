// Fault injection for the tests of the writer's commit: NIBBLE_TEST_KILL_AT=<point> makes the process
// SIGKILL itself when it reaches that point; NIBBLE_TEST_STOP_AT=<point> makes it SIGSTOP itself there
// (it goes on at SIGCONT), so a test can look at the output folder of a live run. Unset: nothing.
#pragma once

namespace nibble {

void kill_point(const char* point);

}  // namespace nibble
