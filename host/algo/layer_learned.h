// awq_learned_layer: awq_lite's scales and codes (or awq_gptq's) for a layer group's weights, then their rounding and block
// scales learned together on the layer's whole output (calib/layer_learning.h). Emit hands the quantizer the
// group's weights at once (CalibratedQuantizer::begin_group); it learns them, then gives each its result.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calib/calibration.h"
#include "calib/layer_learning.h"
#include "host/algo/calibrated_quantizer.h"
#include "host/algo/gptq.h"
#include "host/options.h"
#include "kernels/backend.h"

namespace nibble {

LayerLearningOptions layer_learning_options(const QuantizeOptions& o);

class LayerLearnedQuantizer : public CalibratedQuantizer {
 public:
  // learner null: the group is not learned (`why`), awq_lite's codes are its result.
  LayerLearnedQuantizer(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend, LayerLearner* learner,
                        int group, std::string why);
  bool wants_group() const override { return true; }
  void begin_group(const std::vector<GroupWeight>& weights) override;
  void quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                const std::vector<float>* awq_scale, kernels::QuantResult& q) override;

 private:
  const QuantizeOptions& o_;
  Calibration& calib_;
  kernels::Backend& backend_;
  LayerLearner* learner_;
  int group_;
  std::string why_;
  std::map<std::string, kernels::QuantResult> results_;
  std::unique_ptr<GptqQuantizer> gptq_;  // --learned_layer_from_gptq / --learned_layer_sweeps: the start
};

// What the run's layer learning did (the report's summary.layer_learning).
nlohmann::json layer_learning_summary();

}  // namespace nibble
