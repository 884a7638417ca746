// libFuzzer target over the whole `nibble quantize --algo rtn_dq` run (load, plan, RTN kernels,
// rewrite, writer) on a fuzzed model: it either writes a model or throws nibble::Error and
// leaves nothing in the output folder. Same input layout as fuzz_loader.cc.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "host/options.h"
#include "host/run/pipeline.h"
#include "loaders/error.h"

namespace fs = std::filesystem;

namespace {

struct Sandbox {
  fs::path root, model_dir, model, data, out_dir;
  Sandbox() {
    const char* base = std::getenv("NIBBLE_FUZZ_TMP");
    fs::path b = base ? fs::path(base) : (fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path());
    std::string tmpl = (b / "nibble-fuzzq-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    root = tmpl;
    model_dir = root / "m";
    out_dir = root / "out";
    fs::create_directories(model_dir);
    model = model_dir / "model.onnx";
    data = model_dir / "model.onnx.data";
    spdlog::set_level(spdlog::level::off);
  }
  ~Sandbox() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  static void write(const fs::path& p, const uint8_t* d, size_t n) {
    FILE* f = std::fopen(p.c_str(), "wb");
    if (!f) std::abort();
    if (n && std::fwrite(d, 1, n, f) != n) std::abort();
    std::fclose(f);
  }
};

Sandbox& sandbox() {
  static Sandbox s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Sandbox& sb = sandbox();
  size_t n_ext = 0;
  if (size >= 2) {
    n_ext = size_t(data[0]) | (size_t(data[1]) << 8);
    data += 2;
    size -= 2;
    if (n_ext > size) n_ext = size;
  }
  const size_t n_graph = size - n_ext;
  Sandbox::write(sb.model, data, n_graph);
  Sandbox::write(sb.data, data + n_graph, n_ext);

  nibble::QuantizeOptions o;
  o.onnx_path = sb.model.string();
  o.output_path = (sb.out_dir / "q.onnx").string();
  o.algo = nibble::Algo::kRtnDq;
  o.device = nibble::kernels::Device::kCpu;
  o.threads = 1;
  o.force = true;
  o.quiet = true;
  static const nibble::Format formats[] = {nibble::Format::kDq, nibble::Format::kQdq, nibble::Format::kMatMulNBits};
  o.format = formats[n_graph % 3];
  o.zero_point_flag = (n_ext & 1) != 0;
  bool ok = false;
  try {
    ok = nibble::run_quantize(o) == 0;
  } catch (const nibble::Error&) {
  }
  std::error_code ec;
  if (!ok && fs::exists(sb.out_dir, ec) && !fs::is_empty(sb.out_dir, ec)) {
    std::fprintf(stderr, "a failed run left files in %s\n", sb.out_dir.c_str());
    std::abort();
  }
  fs::remove_all(sb.out_dir, ec);
  return 0;
}
