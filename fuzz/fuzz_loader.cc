// libFuzzer target over the model loader: whatever the bytes, OnnxModel::load, input_files(),
// view() of every initializer and make_plan() either succeed or throw nibble::Error. Anything
// else (a crash, a sanitizer report, another exception type, a view the kernels would read past)
// is a finding.
//
// Input layout: [u16 little-endian n][graph bytes][n' external-data bytes], n' = min(n, rest).
// The graph is written to <tmp>/model.onnx and the external bytes to <tmp>/model.onnx.data (also
// reachable as "sub/w.bin" through a folder, and a symlink "out.bin" pointing outside the folder),
// so `location` strings in the graph have real files to hit. Build: see fuzz/README.md.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "host/graph/plan.h"
#include "loaders/error.h"
#include "loaders/onnx_model.h"

namespace fs = std::filesystem;

namespace {

struct Sandbox {
  fs::path root, model_dir, model, data, sub_data;
  Sandbox() {
    const char* base = std::getenv("NIBBLE_FUZZ_TMP");
    fs::path b = base ? fs::path(base) : (fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path());
    std::string tmpl = (b / "nibble-fuzz-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    root = tmpl;
    model_dir = root / "m";
    fs::create_directories(model_dir / "sub");
    model = model_dir / "model.onnx";
    data = model_dir / "model.onnx.data";
    sub_data = model_dir / "sub" / "w.bin";
    // A file outside the model folder, reachable only through a symlink inside it.
    write(root / "outside.bin", reinterpret_cast<const uint8_t*>("0123456789abcdef"), 16);
    std::error_code ec;
    fs::create_symlink(root / "outside.bin", model_dir / "out.bin", ec);
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

// Reads every byte of a view: a view whose range is not really mapped faults here, under the
// fuzzer, instead of in a kernel later.
uint8_t touch(const nibble::TensorView& v) {
  uint8_t acc = 0;
  for (uint64_t i = 0; i < v.nbytes; ++i) acc ^= v.data[i];
  return acc;
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
  Sandbox::write(sb.sub_data, data + n_graph, n_ext);

  volatile uint8_t sink = 0;
  try {
    auto m = nibble::OnnxModel::load(sb.model.string());
    (void)m->input_files();
    for (const auto& t : m->proto().graph().initializer()) {
      try {
        nibble::TensorView v = m->view(t);
        sink = sink ^ touch(v);
        // What the kernels rely on: a float view holds numel elements of its dtype.
        const uint64_t es = nibble::dtype_size(v.dtype);
        if (nibble::is_quantizable_float(v.dtype) && v.nbytes != uint64_t(v.numel) * es) {
          std::fprintf(stderr, "view of '%s' has %llu bytes for %lld elements\n", t.name().c_str(),
                       (unsigned long long)v.nbytes, (long long)v.numel);
          std::abort();
        }
        m->release(v);
      } catch (const nibble::Error&) {
        // one bad tensor: the others must still be checked
      }
    }
    nibble::PlanOptions popt;
    popt.nodes_to_exclude = {"/lm_head"};
    nibble::Plan plan = nibble::make_plan(*m, popt);
    for (const auto& pw : plan.weights) {
      const onnx::TensorProto* t = m->initializer(pw.weight);
      if (!t || pw.rows <= 0 || pw.cols <= 0) std::abort();
      try {
        nibble::TensorView v = m->view(*t);
        if (v.nbytes < uint64_t(pw.rows) * uint64_t(pw.cols) * nibble::dtype_size(pw.dtype)) {
          std::fprintf(stderr, "planned weight '%s' [%lld, %lld] has only %llu bytes\n", pw.weight.c_str(),
                       (long long)pw.rows, (long long)pw.cols, (unsigned long long)v.nbytes);
          std::abort();
        }
      } catch (const nibble::Error&) {
      }
    }
  } catch (const nibble::Error&) {
  }
  return 0;
}
