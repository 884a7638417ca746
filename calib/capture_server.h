// One calib/capture.py for the whole run: its `serve` mode takes each capture (one per layer group, layer
// by layer) and each `grid` as a request on its stdin, so Python's imports and ONNX Runtime's start are
// paid once per nibble run instead of once per layer group (0.5 s and more each: most of what layer by
// layer cost beyond the whole-model pass). NIBBLE_CALIB_SERVER=0 starts a child per request instead.
#pragma once
#include <string>
#include <vector>

namespace nibble {

// Runs capture.py with `args` (what follows the script on its command line: "capture ..." or "grid ...").
// stderr lines are passed through unless quiet; a failure throws Error with the child's last line that
// starts with "calibration: ", else its exit status.
void run_capture(const std::vector<std::string>& args, bool quiet);

// How many capture.py processes this run started (the report's summary.calibration_processes): 1 for a
// calibrated run, one per request with NIBBLE_CALIB_SERVER=0, 0 without calibration.
int capture_processes_started();

}  // namespace nibble
