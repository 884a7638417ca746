// The backend checks of the tensor operations: upload, reserve, upload_into and download. What comes
// back is what went up, bit for bit, and an operation given the uploaded tensor (read in place on a
// device) computes what the reference computes from host memory.
#include <cstring>
#include <string>

#include "kernels/backend_check.h"
#include "kernels/backend_check_data.h"

namespace nibble::kernels {
namespace {

using check::Case;
using check::same;

std::vector<uint8_t> bytes_of(const WeightMatrix& w) {
  const auto* p = static_cast<const uint8_t*>(w.data);
  return std::vector<uint8_t>(p, p + w.bytes());
}

// The weight on the backend: back as it went, and RTN reading it gives the reference's result.
std::string check_upload(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const WeightMatrix up = g.upload_weight(w.m);
  if (auto e = same(bytes_of(w.m), g.download(up.tensor()), "downloaded weight"); !e.empty()) return e;
  QuantResult a, x;
  r.rtn(w.m, c.spec(), a);
  g.rtn(up, c.spec(), x);
  if (auto e = same(a.codes, x.codes, "codes of the uploaded weight"); !e.empty()) return e;
  if (auto e = same(a.scales, x.scales, "scales of the uploaded weight"); !e.empty()) return e;
  // A float64 tensor (a Gram matrix's blocks) comes back as the same doubles, exact in float32 or not.
  std::vector<double> d = check::gram(20, 16, 7);
  d[5] = 1.0 / 3.0;  // not exact in float32
  const Tensor dt = g.upload(host_view(DType::kFloat64, {16, 16}, d.data()));
  std::vector<double> back(d.size());
  const std::vector<uint8_t> raw = g.download(dt);
  if (raw.size() != back.size() * 8) return "float64 tensor: " + std::to_string(raw.size()) + " bytes back";
  std::memcpy(back.data(), raw.data(), raw.size());
  return same(d, back, "float64 tensor");
}

// Two weights into one room, a third past its end comes back as it was; all read back unchanged.
std::string check_room(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const std::shared_ptr<Buffer> room = g.reserve({w.m.bytes(), w.m.bytes()});
  std::vector<Tensor> held;  // each holds its piece of the room
  for (int i = 0; i < 3; ++i) {
    held.push_back(g.upload_into(w.m.tensor(), room));
    if (room && (i < 2) != (held.back().buffer != nullptr)) return "upload " + std::to_string(i) + " into a room of two";
    if (auto e = same(bytes_of(w.m), g.download(held.back()), "downloaded weight"); !e.empty()) return e;
  }
  held.clear();  // the pieces go back before the room
  (void)r, (void)c;
  return {};
}

// A host tensor and an operation's result (a scaled weight) come back with their bytes.
std::string check_download(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  if (auto e = same(bytes_of(w.m), g.download(w.m.tensor()), "host tensor"); !e.empty()) return e;
  const auto s = check::positive(c.K, 0.5f, 2.0f, 3);
  return same(r.download(r.scale_weight_f32(w.m, s.data()).tensor()),
              g.download(g.scale_weight_f32(w.m, s.data()).tensor()), "scaled weight");
}

}  // namespace

std::vector<OpCheck> check_backend_tensors(Backend& ref, Backend& b, const std::vector<Case>& cs) {
  const std::vector<Case> one{cs.front()};
  return {check::run_cases("upload", ref, b, cs, check_upload, 200),
          check::run_cases("reserve", ref, b, one, check_room, 210),
          check::run_cases("upload_into", ref, b, cs, check_room, 220),
          check::run_cases("download", ref, b, cs, check_download, 230)};
}

}  // namespace nibble::kernels
