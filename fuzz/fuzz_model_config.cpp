// libFuzzer target: arbitrary bytes as config.json (and generation_config.json).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto c = perry::io::parse_model_config(text, "fuzz/config.json");
    (void)perry::io::model_config_to_json(c);
  } catch (const perry::Error&) {
  }
  try {
    (void)perry::io::parse_generation_config(text, "fuzz/generation_config.json");
  } catch (const perry::Error&) {
  }
  return 0;
}
