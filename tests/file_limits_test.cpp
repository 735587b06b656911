// The limits a safetensors header may claim (storage/checkpoint.h, listed in SECURITY.md): each
// one refused with an error that names the file and the limit, never an allocation sized by
// the file's claim.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "storage/checkpoint.h"

namespace deltafin {
namespace {

std::vector<uint8_t> file_with_header(const std::string& header, uint64_t claimed_len = 0) {
  const uint64_t len = claimed_len != 0 ? claimed_len : header.size();
  std::vector<uint8_t> f(8 + header.size());
  std::memcpy(f.data(), &len, 8);
  std::memcpy(f.data() + 8, header.data(), header.size());
  return f;
}

std::string error_of(const std::vector<uint8_t>& f) {
  try {
    parse_safetensors_header(f.data(), f.size(), "x.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(FileLimits, HeaderLengthPastTheFileOrTheLimit) {
  EXPECT_NE(error_of(file_with_header("{}", 1000)).find("points past the end of the file"),
            std::string::npos);
  std::vector<uint8_t> big(8 + kMaxHeaderBytes + 1, ' ');
  const uint64_t len = kMaxHeaderBytes + 1;
  std::memcpy(big.data(), &len, 8);
  EXPECT_NE(error_of(big).find("limit 100 MiB"), std::string::npos);
}

TEST(FileLimits, TensorCountNameLengthAndRank) {
  // One entry more than the limit (tensors of no bytes, so only the count is wrong).
  std::string many = "{";
  for (size_t i = 0; i <= kMaxTensorsPerShard; ++i) {
    many += (i ? ",\"t" : "\"t") + std::to_string(i) +
            "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}";
  }
  many += "}";
  EXPECT_NE(error_of(file_with_header(many)).find("limit 1000000 tensors per file"),
            std::string::npos);

  nlohmann::json long_name;
  long_name[std::string(kMaxTensorNameBytes + 1, 'n')] = {
      {"dtype", "U8"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  EXPECT_NE(error_of(file_with_header(long_name.dump())).find("a tensor name of 1025 bytes"),
            std::string::npos);

  nlohmann::json deep;
  deep["t"] = {{"dtype", "U8"},
               {"shape", std::vector<int>(kMaxTensorRank + 1, 1)},
               {"data_offsets", {0, 1}}};
  EXPECT_NE(error_of(file_with_header(deep.dump() + " ")).find("9 dimensions (limit 8)"),
            std::string::npos);

  nlohmann::json fine;
  fine["t"] = {
      {"dtype", "U8"}, {"shape", std::vector<int>(kMaxTensorRank, 1)}, {"data_offsets", {0, 1}}};
  auto f = file_with_header(fine.dump());
  f.push_back(7);
  EXPECT_EQ(error_of(f), "(accepted)");
}

}  // namespace
}  // namespace deltafin
