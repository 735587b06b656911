// Kimi K2 / DeepSeek-V3 quantised weights (tensor/quant.h) against the float64 reference: the
// files in tests/data/quant (written by tools/family/make_quant_cases.py from the reference's own
// dequantisers, see the README there) hold FP8 and INT4 tensors exactly as the releases store
// them next to the float32 weights the reference decodes them to. Each is read through the
// storage layer's safetensors parser, viewed through fp8_block_matrix / int4_packed_matrix as a
// loader will, and must decode bit for bit to the expected weights — by the reference decoding
// (matrix_element) and by every kernel table's products (quant_check.h), whole and as row
// slices. Then every check of the views: wrong dtypes, shapes, byte counts, block and group
// sizes, hostile weight_shape values, NaN codes and non-finite scales, each an Error naming the
// tensor.
#include "tensor/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/kernels.h"
#include "quant_check.h"
#include "storage/checkpoint.h"
#include "tensor/dtype.h"
#include "test_util.h"

namespace deltafin {
namespace {

using kernels::KernelTable;

// A safetensors file of tests/data/quant, read whole, its tensors by name.
struct File {
  std::string bytes;
  std::map<std::string, TensorInfo> tensors;
  explicit File(const std::string& name) {
    const std::string path = test::data_dir() + "/quant/" + name;
    bytes = test::slurp(path);
    for (TensorInfo& t : parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                  bytes.size(), path))
      tensors[t.name] = t;
  }
  const TensorInfo& at(const std::string& n) const {
    auto it = tensors.find(n);
    if (it == tensors.end()) throw Error("tests/data/quant: no tensor " + n);
    return it->second;
  }
  std::vector<float> floats(const std::string& n) const {
    const TensorInfo& t = at(n);
    EXPECT_EQ(t.dtype, DType::kF32);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * 4);
    return v;
  }
};

std::vector<const KernelTable*> tables() {
  std::vector<const KernelTable*> out = {&kernels::scalar_table()};
  for (const KernelTable* t :
       {kernels::avx2_table(), kernels::avx512_table(), kernels::neon_table()})
    if (t != nullptr) out.push_back(t);
  return out;
}

// Bit for bit, +0 and -0 apart (the reference decoding keeps the sign of a zero product).
std::string first_difference(const Matrix& w, const std::vector<float>& want) {
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) {
      const float got = matrix_element(w, r, c), e = want[static_cast<size_t>(r * w.cols + c)];
      if (std::memcmp(&got, &e, 4) != 0)
        return "W[" + std::to_string(r) + "," + std::to_string(c) + "] = " + std::to_string(got) +
               ", reference " + std::to_string(e);
    }
  }
  return "";
}

void expect_decodes_like_reference(const Matrix& w, const std::vector<float>& want) {
  ASSERT_EQ(static_cast<int64_t>(want.size()), w.rows * w.cols);
  EXPECT_EQ(first_difference(w, want), "");
  for (const KernelTable* t : tables()) EXPECT_EQ(test::decode_mismatch(*t, w, want), "");
  // a slice starting inside a block of rows, as a device piece or a head's rows would be
  const int64_t b = w.rows / 3 + 1;
  const Matrix s = w.row_slice(b, w.rows);
  const std::vector<float> tail(want.begin() + b * w.cols, want.end());
  EXPECT_EQ(first_difference(s, tail), "");
  for (const KernelTable* t : tables()) EXPECT_EQ(test::decode_mismatch(*t, s, tail), "");
}

TEST(QuantFormats, SafetensorsDtypeNames) {
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("I32"), DType::kI32);
  EXPECT_EQ(parse_dtype("I64"), DType::kI64);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_STREQ(dtype_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_STREQ(weight_format_name(WeightFormat::kFP8), "fp8");
  EXPECT_STREQ(weight_format_name(WeightFormat::kInt4), "int4");
}

TEST(QuantFormats, E4M3TableIsTheReferences) {
  File f("fp8.safetensors");
  const std::vector<float> want = f.floats("e4m3_values");
  ASSERT_EQ(want.size(), 256u);
  for (int c = 0; c < 256; ++c) {
    const float got = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want[c])) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(std::memcmp(&got, &want[c], 4), 0)
          << "code " << c << ": " << got << " vs " << want[c];
    }
  }
}

TEST(QuantFormats, Fp8DequantisesLikeTheReference) {
  File f("fp8.safetensors");
  for (const char* name : {"ragged", "special"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const Matrix w = fp8_block_matrix(f.at(n + ".weight"), f.at(n + ".weight_scale_inv"));
    EXPECT_EQ(w.format, WeightFormat::kFP8);
    EXPECT_NO_THROW(check_quantized_values(w, n));
    expect_decodes_like_reference(w, f.floats(n + ".expected"));
  }
  // the ragged edges are really there: [130, 260] with scales [2, 3]
  EXPECT_EQ(f.at("ragged.weight_scale_inv").shape, (std::vector<int64_t>{2, 3}));
}

TEST(QuantFormats, Int4DequantisesLikeTheReference) {
  File f("int4.safetensors");
  for (const char* name : {"expert", "ragged"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const auto shape = int4_weight_shape(f.at(n + ".weight_shape"));
    const Matrix w =
        int4_packed_matrix(f.at(n + ".weight_packed"), f.at(n + ".weight_scale"), shape);
    EXPECT_EQ(w.format, WeightFormat::kInt4);
    EXPECT_NO_THROW(check_quantized_values(w, n));
    expect_decodes_like_reference(w, f.floats(n + ".expected"));
  }
  // I64 and I32 weight_shape, and 100 columns: 13 words, the last half padding
  EXPECT_EQ(f.at("expert.weight_shape").dtype, DType::kI64);
  EXPECT_EQ(f.at("ragged.weight_shape").dtype, DType::kI32);
  EXPECT_EQ(int4_weight_shape(f.at("ragged.weight_shape")), (std::array<int64_t, 2>{33, 100}));
}

// ---- the views' checks ------------------------------------------------------------------------

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TensorInfo tensor(std::string name, DType dt, std::vector<int64_t> shape, const void* data) {
  TensorInfo t;
  t.name = std::move(name);
  t.dtype = dt;
  t.shape = std::move(shape);
  t.nbytes = static_cast<uint64_t>(t.numel()) * dtype_size(dt);
  t.data = static_cast<const uint8_t*>(data);
  return t;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(QuantFormats, Fp8ViewChecksEveryTensor) {
  std::vector<uint8_t> bytes(576 * 7168, 0x38);
  std::vector<float> sc(5 * 56, 1.0f);
  const TensorInfo w = tensor("kv_a.weight", DType::kF8E4M3, {576, 7168}, bytes.data());
  const TensorInfo s = tensor("kv_a.weight_scale_inv", DType::kF32, {5, 56}, sc.data());
  // K2's kv_a_proj_with_mqa: the last row block has 64 rows
  const Matrix m = fp8_block_matrix(w, s);
  EXPECT_EQ(m.rows, 576);
  EXPECT_EQ(m.scale_rows(), 5);
  EXPECT_EQ(m.bytes(), 576 * 7168 + 5 * 56 * 4);
  std::string e = error_of([&] {
    fp8_block_matrix(w, tensor(s.name, DType::kF32, {4, 56}, sc.data()));
  });
  EXPECT_TRUE(has(e, "kv_a.weight_scale_inv") && has(e, "F32[4, 56]") &&
              has(e, "expected F32[5, 56]"))
      << e;
  e = error_of([&] { fp8_block_matrix(w, tensor(s.name, DType::kBF16, {5, 56}, sc.data())); });
  EXPECT_TRUE(has(e, "BF16[5, 56]")) << e;
  e = error_of([&] {
    fp8_block_matrix(tensor(w.name, DType::kBF16, {576, 7168}, bytes.data()), s);
  });
  EXPECT_TRUE(has(e, "kv_a.weight") && has(e, "expected F8_E4M3")) << e;
  e = error_of([&] { fp8_block_matrix(tensor(w.name, DType::kF8E4M3, {576}, bytes.data()), s); });
  EXPECT_TRUE(has(e, "two positive dimensions")) << e;
  e = error_of([&] { fp8_block_matrix(w, s, {64, 64}); });
  EXPECT_TRUE(has(e, "weight_block_size [64, 64]")) << e;
  TensorInfo short_bytes = s;
  short_bytes.nbytes -= 4;
  e = error_of([&] { fp8_block_matrix(w, short_bytes); });
  EXPECT_TRUE(has(e, "bytes")) << e;
}

TEST(QuantFormats, Int4ViewChecksEveryTensor) {
  std::vector<uint8_t> packed(2048 * 896 * 4, 0x88), scales(2048 * 224 * 2, 0);
  const int64_t shape64[2] = {2048, 7168};
  const int32_t shape32[2] = {2048, 7168};
  const TensorInfo p = tensor("e.weight_packed", DType::kI32, {2048, 896}, packed.data());
  const TensorInfo s = tensor("e.weight_scale", DType::kBF16, {2048, 224}, scales.data());
  // K2-Thinking's expert gate_proj
  const auto sh = int4_weight_shape(tensor("e.weight_shape", DType::kI64, {2}, shape64));
  EXPECT_EQ(sh, (std::array<int64_t, 2>{2048, 7168}));
  EXPECT_EQ(int4_weight_shape(tensor("e.weight_shape", DType::kI32, {2}, shape32)), sh);
  const Matrix m = int4_packed_matrix(p, s, sh);
  EXPECT_EQ(m.cols, 7168);
  EXPECT_EQ(m.row_bytes(), 3584);
  EXPECT_EQ(m.bytes(), 2048 * (3584 + 448));
  std::string e = error_of([&] { int4_packed_matrix(p, s, {2048, 7200}); });
  EXPECT_TRUE(has(e, "e.weight_packed") && has(e, "expected I32[2048, 900]")) << e;
  e = error_of([&] {
    int4_packed_matrix(p, tensor(s.name, DType::kF32, {2048, 224}, scales.data()), sh);
  });
  EXPECT_TRUE(has(e, "e.weight_scale") && has(e, "expected BF16[2048, 224]")) << e;
  e = error_of([&] { int4_packed_matrix(p, s, sh, 128); });
  EXPECT_TRUE(has(e, "group_size 128")) << e;
  e = error_of([&] { int4_packed_matrix(p, s, {0, 7168}); });
  EXPECT_TRUE(has(e, "positive")) << e;
  const int64_t bad[2] = {-1, 7168}, huge[2] = {int64_t{1} << 40, 8};
  e = error_of([&] { int4_weight_shape(tensor("e.weight_shape", DType::kI64, {2}, bad)); });
  EXPECT_TRUE(has(e, "e.weight_shape") && has(e, "[-1, 7168]")) << e;
  e = error_of([&] { int4_weight_shape(tensor("e.weight_shape", DType::kI64, {2}, huge)); });
  EXPECT_TRUE(has(e, "below 2^31")) << e;
  e = error_of([&] { int4_weight_shape(tensor("e.weight_shape", DType::kI16, {2}, shape32)); });
  EXPECT_TRUE(has(e, "expected I64[2] or I32[2]")) << e;
  e = error_of([&] { int4_weight_shape(tensor("e.weight_shape", DType::kI64, {3}, shape64)); });
  EXPECT_TRUE(has(e, "I64[3]")) << e;
  e = error_of([&] { int4_weight_shape(tensor("e.weight_shape", DType::kI64, {2}, nullptr)); });
  EXPECT_TRUE(has(e, "not mapped")) << e;
}

TEST(QuantFormats, ValueCheckFindsNanCodesAndNonFiniteScales) {
  std::vector<uint8_t> codes(130 * 260, 0x38);
  std::vector<float> sc(2 * 3, 0.5f);
  const Matrix w = fp8_block_matrix(tensor("q.weight", DType::kF8E4M3, {130, 260}, codes.data()),
                                    tensor("q.weight_scale_inv", DType::kF32, {2, 3}, sc.data()));
  EXPECT_NO_THROW(check_quantized_values(w, "q.weight"));
  codes[129 * 260 + 259] = 0xFF;
  std::string e = error_of([&] { check_quantized_values(w, "q.weight"); });
  EXPECT_TRUE(has(e, "q.weight") && has(e, "row 129, column 259") && has(e, "0xFF")) << e;
  codes[129 * 260 + 259] = 0x7E;
  sc[5] = INFINITY;
  e = error_of([&] { check_quantized_values(w, "q.weight"); });
  EXPECT_TRUE(has(e, "scale [1, 2]") && has(e, "inf")) << e;

  std::vector<uint8_t> packed(4 * 4 * 4, 0), scales(4 * 1 * 2, 0);
  const Matrix q =
      int4_packed_matrix(tensor("e.weight_packed", DType::kI32, {4, 4}, packed.data()),
                         tensor("e.weight_scale", DType::kBF16, {4, 1}, scales.data()), {4, 32});
  EXPECT_NO_THROW(check_quantized_values(q, "e"));
  scales[5] = 0x7F;
  scales[4] = 0xC0;  // BF16 NaN in row 2
  e = error_of([&] { check_quantized_values(q, "e"); });
  EXPECT_TRUE(has(e, "scale [2, 0]") && has(e, "nan")) << e;
}

}  // namespace
}  // namespace deltafin
