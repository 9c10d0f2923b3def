// Shared by the golden tests (tests/model/test_golden.cpp on the CPU, tests/cuda/test_cuda_model.cpp
// on the GPU): where the source tree is, the transformers goldens in tests/golden/*.json, and a
// gtest parameter name made from a checkpoint name.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace perry::golden_test {

// PERRY_SOURCE_DIR from the environment (ctest sets it), else the tree this was built from.
inline std::string source_dir() {
  if (const char* e = std::getenv("PERRY_SOURCE_DIR")) return e;
  return PERRY_SOURCE_DIR;
}

// The golden names (file stems of tests/golden/*.json), sorted.
inline std::vector<std::string> golden_files() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/tests/golden"))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline nlohmann::json load_golden(const std::string& name) {
  return nlohmann::json::parse(read_text_file(source_dir() + "/tests/golden/" + name + ".json"));
}

// A checkpoint name as a gtest parameter name: every non-alphanumeric character becomes '_'.
inline std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

}  // namespace perry::golden_test
