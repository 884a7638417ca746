// The format registry: one record per Format, names that round-trip through the --format parser, and the byte
// model mixed precision's size estimate reads, checked against the bytes the rewriter writes for a weight.
#include <gtest/gtest.h>
#include <onnx/onnx-ml.pb.h>

#include <set>
#include <string>

#include "host/algo/mixed_precision.h"
#include "host/formats.h"
#include "host/graph/rewrite.h"
#include "host/methods.h"
#include "kernels/cpu/cpu_backend.h"
#include "loaders/error.h"
#include "loaders/model_writer.h"
#include "scratch_dir.h"

using namespace nibble;

TEST(Formats, OneRecordPerFormatAndNamesRoundTrip) {
  std::set<std::string> names;
  for (int i = 0; i <= int(kLastFormat); ++i) {
    const Format f = Format(i);
    const FormatRecord& r = format_record(f);
    EXPECT_EQ(r.format, f);
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    EXPECT_STREQ(name_of(f), r.name);
    EXPECT_EQ(parse_format(r.name), f);
    EXPECT_EQ(find_format(r.name), &r);
  }
  EXPECT_EQ(formats().size(), names.size());
  EXPECT_THROW(parse_format("int4"), Error);
}

TEST(Formats, HelpNamesEachFormatAndEveryDefault) {
  const std::string help = formats_help();
  for (const FormatRecord& r : formats())
    EXPECT_NE(help.find(std::string(r.name) + " (" + r.summary + ")"), std::string::npos) << help;
  EXPECT_NE(help.find("qdq for rtn, dq for the others"), std::string::npos) << help;
}

namespace {

// One MatMul y = x · w with w [K, N] float32.
onnx::ModelProto one_matmul(int64_t K, int64_t N) {
  onnx::ModelProto m;
  m.set_ir_version(10);
  m.add_opset_import()->set_version(21);
  onnx::GraphProto* g = m.mutable_graph();
  onnx::NodeProto* n = g->add_node();
  n->set_name("/mm/MatMul");
  n->set_op_type("MatMul");
  n->add_input("x");
  n->add_input("w");
  n->add_output("y");
  onnx::TensorProto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(K);
  w->add_dims(N);
  for (int64_t i = 0; i < K * N; ++i) w->add_float_data(float((i * 37) % 23) - 11.0f);
  return m;
}

}  // namespace

// The byte model (payload only) is what the rewriter writes for a weight, plus the float weight a format keeps
// (written with the rest of the model): 4 bits in blocks (a partial last one) and 8 bits per channel, with and
// without zero points.
TEST(Formats, ByteModelIsWhatTheRewriterWrites) {
  const int64_t K = 80, N = 24;
  test::ScratchDir dir("nibble_formats");
  auto backend = kernels::make_cpu_backend();
  for (const FormatRecord& f : formats())
    for (int bits : {4, 8})
      for (bool zp : {false, true}) {
        onnx::ModelProto model = one_matmul(K, N);
        ModelWriter::Options wo;
        wo.force = true;
        ModelWriter writer((dir.root() / (std::string(f.name) + "_model.onnx")).string(), wo);
        GraphRewriter rewriter(model, f.format, writer, *backend);
        PlannedWeight pw;
        pw.weight = "w";
        pw.nodes = {0};
        pw.op_type = "MatMul";
        pw.rows = K, pw.cols = N;
        pw.bits = bits;
        pw.block = bits == 8 ? -1 : 32;
        const std::vector<float> w(model.graph().initializer(0).float_data().begin(),
                                   model.graph().initializer(0).float_data().end());
        kernels::QuantSpec spec{bits, pw.resolved_block(), zp};
        kernels::QuantResult q;
        backend->rtn(kernels::WeightMatrix{DType::kFloat32, w.data(), K, N, 0, {}}, spec, q);
        uint64_t bytes = 0;
        rewriter.emit(pw, spec, q, &bytes);
        const uint64_t kept = f.keeps_float_weight ? uint64_t(K * N) * 4 : 0;
        const ZeroPoints z = zp ? ZeroPoints::kCodes : ZeroPoints::kNone;
        EXPECT_EQ(bytes + kept, weight_output_bytes(pw, bits, pw.block, f.format, z, SizeMode::kPayload))
            << f.name << " bits " << bits << " zero point " << zp;
      }
}
