// Room for calibration statistics in TMPDIR: what a run will write there, a check before calibration
// starts, and the sweep of folders that dead runs left behind.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "calib/calibration.h"

namespace nibble {

// Bytes the statistics of `acts` take on disk (what capture writes per activation: float32 and float64
// channel vectors, the float64 Gram matrix or its block diagonal, ModelOpt's token sample).
uint64_t statistics_bytes(const std::vector<Calibration::Request>& acts, const CalibrationExtras& extras);

// Throws Error (one line) when `dir`'s file system has less than `needed` bytes free. The free figure can
// be lowered by the test hook NIBBLE_TEST_TMP_FREE_BYTES (tests simulate a small TMPDIR with it).
void check_free_space(const std::string& dir, uint64_t needed, const std::string& what);

// Removes the "nibble-calib-<owner>-*" folders in `tmp` whose owner process is dead (pid + boot id + start
// time, loaders/owner.h); folders of live runs and of unknown owners stay. Returns the bytes freed.
uint64_t sweep_dead_statistics(const std::string& tmp);

// The template for mkdtemp of this run's statistics folder in `tmp`: its name carries this process's tag.
std::string statistics_dir_template(const std::string& tmp);

}  // namespace nibble
