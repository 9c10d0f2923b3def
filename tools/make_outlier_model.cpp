// make_outlier_model IN_DIR OUT_DIR [--channels 4] [--seed 1]
// Writes an outlier-stressed copy of a float checkpoint (see src/model/outlier_stress.h).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "model/outlier_stress.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s IN_DIR OUT_DIR [--channels N] [--seed S]\n", argv[0]);
    return 2;
  }
  try {
    int channels = 4;
    unsigned seed = 1;
    for (int i = 3; i + 1 < argc; i += 2) {
      std::string k = argv[i];
      if (k == "--channels") channels = std::atoi(argv[i + 1]);
      else if (k == "--seed") seed = unsigned(std::atoi(argv[i + 1]));
      else perry::fail("unknown option {}", k);
    }
    perry::model::write_outlier_stressed(argv[1], argv[2], channels, seed);
    std::fprintf(stderr, "wrote %s\n", argv[2]);
  } catch (const perry::Error& e) {
    std::fprintf(stderr, "make_outlier_model: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
