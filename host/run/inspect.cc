// `nibble inspect MODEL`: the plan without the work (like llama-quantize --dry-run).
#include <cstdio>

#include "host/run/pipeline.h"
#include "host/graph/gather_plan.h"
#include "host/graph/plan.h"
#include "host/run/progress.h"
#include "loaders/onnx_model.h"

namespace nibble {

int run_inspect(const std::string& model_path, const std::vector<std::string>& nodes_to_exclude,
                int64_t block_size, std::optional<int> gather_axis, int64_t gather_block) {
  auto model = OnnxModel::load(model_path);
  const auto files = model->input_files();
  const auto& m = model->proto();
  PlanOptions popt;
  popt.nodes_to_exclude = nodes_to_exclude;
  popt.block_size = block_size;
  popt.gather_axis = gather_axis;
  popt.gather_block = gather_block;
  Plan plan = make_plan(*model, popt);
  find_tied_tables(*model, plan);

  uint64_t init_bytes = 0;
  for (const auto& t : m.graph().initializer()) init_bytes += expected_nbytes(t);
  std::printf("model      %s\n", model->path().c_str());
  std::printf("ir_version %lld, opset %lld (default domain), producer '%s'\n",
              static_cast<long long>(m.ir_version()), static_cast<long long>(model->opset("")),
              m.producer_name().c_str());
  std::printf("graph      %d nodes, %d initializers (%s), %zu external data file(s)\n", m.graph().node_size(),
              m.graph().initializer_size(), human_bytes(init_bytes).c_str(), files.size() - 1);
  std::printf("\n%-4s %-48s %-44s %-16s %-5s %-6s %s\n", "#", "weight", "node", "shape [stored]", "dtype", "layer",
              "size");
  uint64_t q_in = 0, q_out = 0, code_zero_point_bytes = 0, float_zero_point_bytes = 0;
  int idx = 0;
  for (const auto& pw : plan.weights) {
    const uint64_t in = uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype);
    const int64_t G = (pw.K() + pw.resolved_block() - 1) / pw.resolved_block();
    const uint64_t out = uint64_t(pw.rows * pw.cols + 1) / 2 + uint64_t(G * pw.N()) * dtype_size(pw.dtype);
    q_in += in;
    q_out += out;
    code_zero_point_bytes += uint64_t(G * pw.N() + 1) / 2;
    float_zero_point_bytes += uint64_t(G * pw.N()) * dtype_size(pw.dtype);
    char shape[48];
    std::snprintf(shape, sizeof shape, "[%lld, %lld]%s", static_cast<long long>(pw.rows),
                  static_cast<long long>(pw.cols), pw.k_axis ? " T" : "");
    std::printf("%-4d %-48s %-44s %-16s %-5s %-6d %s\n", idx++, pw.weight.c_str(), pw.node_name.c_str(), shape,
                dtype_name(pw.dtype).c_str(), pw.layer, human_bytes(in).c_str());
  }
  std::printf("\n%zu weights to quantize: %s -> about %s at INT4 block %lld (symmetric)\n", plan.weights.size(),
              human_bytes(q_in).c_str(), human_bytes(q_out).c_str(), static_cast<long long>(block_size));
  std::printf("zero points add about %s (--use_zero_point, or --algo hqq in dq/qdq: INT4 codes), %s with --algo "
              "hqq --format matmulnbits (fractional zero points in the weights' float type)\n",
              human_bytes(code_zero_point_bytes).c_str(), human_bytes(float_zero_point_bytes).c_str());
  std::printf("%zu sibling groups (weights sharing one input)\n", plan.siblings.size());
  for (const auto& pw : plan.gathers) {
    const uint64_t in = uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype);
    const int64_t G = (pw.K() + pw.block - 1) / pw.block;
    const uint64_t out = uint64_t(pw.rows * pw.cols + 1) / 2 + uint64_t(G * pw.N()) * dtype_size(pw.dtype);
    std::printf("\nembedding %s [%lld, %lld] %s read by %zu Gather(s) (%s): %s -> about %s at INT4 block %lld "
                "along axis %d%s\n", pw.weight.c_str(), static_cast<long long>(pw.rows),
                static_cast<long long>(pw.cols), dtype_name(pw.dtype).c_str(), pw.nodes.size(),
                pw.node_name.c_str(), human_bytes(in).c_str(), human_bytes(out).c_str(),
                static_cast<long long>(pw.block), pw.k_axis,
                pw.tied_to.empty() ? ""
                                   : ("; tied to " + pw.tied_to + " (one copy in --format matmulnbits when H is a "
                                      "multiple of its --block_size)").c_str());
  }
  if (!plan.skipped.empty()) {
    std::printf("\nleft as they are:\n");
    for (const auto& s : plan.skipped) std::printf("  %-48s %-8s %s\n", s.node.c_str(), s.op_type.c_str(), s.reason.c_str());
  }
  return 0;
}

}  // namespace nibble
