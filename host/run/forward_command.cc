// `nibble forward`: the layer engine run on a whole graph, its chosen values written to a folder (what the
// end-to-end tests hold beside ONNX Runtime's, and a user's way to see whether the engine runs a model).
#include <chrono>
#include <cstdio>

#include "forward/forward_files.h"
#include "forward/graph_run.h"
#include "host/run/pipeline.h"
#include "loaders/error.h"
#include "loaders/onnx_model.h"

namespace nibble {

int run_forward(const ForwardArgs& a) {
  auto model = OnnxModel::load(a.onnx_path);
  kernels::BackendOptions bopt;
  bopt.device = a.device;
  std::string why;
  const auto backend = kernels::make_backend(bopt, &why);  // before the graph: its device values go first
  forward::GraphRun graph(*model);
  if (backend->transfer_ledger()) graph.use_backend(backend.get());
  const auto missing = graph.unsupported();
  if (!missing.empty())
    throw Error("the layer engine cannot run " + a.onnx_path + ": " + missing.front() +
                (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : ""));
  const auto feeds = forward::read_feeds(a.feeds);
  const std::set<std::string> wanted(a.values.begin(), a.values.end());
  std::map<std::string, forward::Value> captured;
  const auto t0 = std::chrono::steady_clock::now();
  graph.run(feeds, {}, wanted,
            [&](const std::string& name, const forward::Value& v) { captured[name] = graph.host_value(v); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& w : wanted)
    if (!captured.count(w)) throw Error("the graph of " + a.onnx_path + " computes no value named '" + w + "'");
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, s] : graph.seconds_per_op()) ops[op] = s;
  const forward::ProductMeter& p = graph.products();
  forward::write_values(a.out, captured,
                        {{"seconds", seconds}, {"gflop", p.flop * 1e-9}, {"product_seconds", p.seconds},
                         {"seconds_per_op", ops}});
  std::fprintf(stderr, "nibble: forward: %zu values of %s in %.2f s on %s -> %s\n", captured.size(),
               a.onnx_path.c_str(), seconds, backend->transfer_ledger() ? backend->name().c_str() : "cpu", a.out.c_str());
  return 0;
}

}  // namespace nibble
