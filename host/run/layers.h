// Layer by layer (--layer_by_layer): the plan's weights in groups, one per decoder layer; for each group
// in turn calibration runs that layer alone on the boundary activations the previous layer left
// (calib/layers.py), then its search, quantization and writing, then its statistics are dropped. RAM
// and temporary disk hold one layer's statistics plus the calibration windows' boundary, whatever the
// depth. After every layer a checkpoint is written, so --resume continues from the first unfinished
// layer and gives the same bytes as an uninterrupted run. With --mixed_strategy sensitivity a first sweep
// over the layers chooses the INT8 set before this loop (host/run/layer_sensitivity.h).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host/run/layer_state.h"
#include "host/run/stages.h"

namespace nibble {

// The plan's weight indices per layer, in layer order (weights of no layer last), siblings kept
// together. Empty, with *why, when the plan cannot be cut (fewer than two layers).
std::vector<std::vector<size_t>> layer_groups(const Plan& plan, std::string* why);

// The folder beside the output where a layer-by-layer run keeps its state (boundary activations,
// checkpoint, the output data written so far).
std::string layer_state_dir(const std::string& output_path);

// Runs every group: calibrate, search, emit. On --resume, finished layers are laid out again from the
// checkpoint without being computed. The writer must have been opened on the state's data file
// (layer_writer_options). `announce` (the run's first progress lines) is called once, after the first
// layer's calibration, so that bad calibration input fails with its one error line alone.
Emitted layer_by_layer_stage(const QuantizeOptions& o, OnnxModel& model, Planned& planned,
                             const std::vector<std::vector<size_t>>& groups, GraphRewriter& rewriter,
                             ModelWriter& writer, kernels::Backend& backend, const std::function<void()>& announce);

// Opens the state folder of a layer-by-layer run of `groups` layer groups, locked for this run. Refuses
// (Error, one line), before anything is deleted, when the output exists without --force, when --resume
// finds no state, when another live run holds the folder, and when a stopped run's state would be lost
// (a checkpoint, and neither --resume nor --force).
std::unique_ptr<LayerStateLock> open_layer_state(const QuantizeOptions& o, size_t groups);

// The writer options of a layer-by-layer run: its data file in the state folder, reopened at the
// checkpoint's size on --resume (a fresh state otherwise, with the fingerprints of its inputs). Throws
// Error when --resume finds a checkpoint of other flags or other inputs. Call open_layer_state first.
ModelWriter::Options layer_writer_options(const QuantizeOptions& o, ModelWriter::Options base);

// Removes the state folder (after commit).
void remove_layer_state(const QuantizeOptions& o);

// After a failed run: removes the state folder when no layer was finished (nothing to resume), so that
// bad input leaves nothing behind; a folder with finished work is kept for --resume.
void remove_layer_state_if_nothing_finished(const QuantizeOptions& o);

}  // namespace nibble
