// safetensors reader: round trip through the writer, and every kind of lying or truncated file
// must be a perry::Error with a useful message, never a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"

using namespace perry;
using namespace perry::io;

namespace {

std::string tmp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "perry_test_io";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> f(8 + header.size() + data_bytes);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f[size_t(i)] = uint8_t(n >> (8 * i));
  std::memcpy(f.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) f[8 + header.size() + i] = uint8_t(i * 37 + 11);
  return f;
}

std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    SafetensorsFile::parse(bytes.data(), bytes.size(), "test.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RoundTripThroughWriter) {
  std::mt19937 rng(5);
  std::vector<uint16_t> a(6 * 7);
  std::vector<float> b(5);
  std::vector<int8_t> c(3 * 4);
  for (auto& x : a) x = uint16_t(rng());
  for (auto& x : b) x = float(rng() % 1000) / 7.0f;
  for (auto& x : c) x = int8_t(rng());
  SafetensorsWriter w;
  w.add("layer.a", DType::BF16, {6, 7}, a.data(), a.size() * 2);
  w.add("b", DType::F32, {5}, b.data(), b.size() * 4);
  w.add("c.qweight", DType::I8, {3, 4}, c.data(), c.size());
  w.add("d.qweight", DType::F8_E4M3, {4, 3}, c.data(), c.size());  // fp8 e4m3 codes (w8a8-fp8)
  w.set_metadata("format", "pt");
  const std::string p = tmp_path("roundtrip.safetensors");
  w.write(p);
  SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors().at("d.qweight").dtype, DType::F8_E4M3);
  EXPECT_EQ(f.tensors().at("d.qweight").nbytes, c.size());
  EXPECT_EQ(std::memcmp(f.tensors().at("d.qweight").data, c.data(), c.size()), 0);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto& ta = f.tensors().at("layer.a");
  EXPECT_EQ(ta.dtype, DType::BF16);
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(std::memcmp(ta.data, a.data(), a.size() * 2), 0);
  EXPECT_EQ(std::memcmp(f.tensors().at("b").data, b.data(), b.size() * 4), 0);
  EXPECT_EQ(std::memcmp(f.tensors().at("c.qweight").data, c.data(), c.size()), 0);
  // Data section starts 8-byte aligned so mmapped tensors can be read with aligned loads.
  EXPECT_EQ((reinterpret_cast<uintptr_t>(f.tensors().at("layer.a").data) - 0) % 8, 0u);
}

TEST(Safetensors, AcceptsValidHandMadeHeader) {
  auto f = make_file(R"({"x":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},"__metadata__":{"k":"v"}})", 12);
  std::map<std::string, std::string> md;
  auto t = SafetensorsFile::parse(f.data(), f.size(), "t", &md);
  EXPECT_EQ(t.at("x").numel(), 6);
  EXPECT_EQ(md.at("k"), "v");
}

TEST(Safetensors, RejectsBadFiles) {
  struct Case { std::vector<uint8_t> bytes; const char* expect; };
  std::vector<Case> cases;
  cases.push_back({{1, 2, 3}, "not a safetensors file"});
  {
    auto f = make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
    f[0] = 0xff; f[1] = 0xff;  // header length past the end
    cases.push_back({f, "runs past the end"});
  }
  {
    auto f = make_file("", 0);
    for (int i = 0; i < 8; ++i) f[size_t(i)] = 0xff;  // absurd header length
    cases.push_back({f, "exceeds"});
  }
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8), "not valid JSON"});
  cases.push_back({make_file(R"([1,2])", 0), "must be a JSON object"});
  cases.push_back({make_file(R"({"x":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 8), "unsupported dtype"});
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative"});
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8), "past the end of the data"});
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "expected 12"});
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "reversed"});
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 16), "overlap"});
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[2]}})", 8), "must have dtype, shape and data_offsets"});
  cases.push_back({make_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8), "overflow"});
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string e = error_of(cases[i].bytes);
    EXPECT_NE(e.find(cases[i].expect), std::string::npos) << "case " << i << ": got '" << e << "'";
    if (i > 0) EXPECT_NE(e.find("test.safetensors"), std::string::npos) << "error must name the file: " << e;
  }
}

TEST(Safetensors, TruncatedFileOnDisk) {
  SafetensorsWriter w;
  std::vector<float> v(100, 1.5f);
  w.add("v", DType::F32, {100}, v.data(), v.size() * 4);
  const std::string p = tmp_path("trunc.safetensors");
  w.write(p);
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 10);
  try {
    SafetensorsFile f(p);
    FAIL() << "truncated file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsFile(tmp_path("does-not-exist.safetensors")), Error);
}
