// synthetic_dump: prints the first 8 bf16 values (hex bits) of named tensors of perry's synthetic
// llama3.2-1b, straight from perry::model::SyntheticWeights — the independent side of the check
// that tools/peers/synthetic_to_gguf.py (numpy) generates exactly the weights perry runs on.
//   synthetic_dump [--preset NAME] TENSOR...      one line per tensor: NAME v0 v1 ... v7
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/weight_source.h"

int main(int argc, char** argv) {
  try {
    std::string preset = "llama3.2-1b";
    std::vector<std::string> names;
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--preset") == 0 && i + 1 < argc) preset = argv[++i];
      else names.emplace_back(argv[i]);
    }
    PERRY_CHECK(!names.empty(), "usage: synthetic_dump [--preset NAME] TENSOR...");
    auto cfg = perry::model::synthetic_preset(preset);
    PERRY_CHECK(cfg.has_value(), "unknown synthetic preset '{}'", preset);
    perry::model::SyntheticWeights w(*cfg, preset);
    for (const auto& n : names) {
      const auto& t = w.get(n);
      PERRY_CHECK(t.dtype == perry::DType::BF16 && t.numel() >= 8, "tensor '{}' is not bf16 with >= 8 values", n);
      const auto* v = reinterpret_cast<const uint16_t*>(t.data);
      std::printf("%s", n.c_str());
      for (int i = 0; i < 8; ++i) std::printf(" %04x", unsigned(v[i]));
      std::printf("\n");
      w.release(n);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synthetic_dump: %s\n", e.what());
    return 1;
  }
}
