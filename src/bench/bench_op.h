// `perry bench-op`: latency of one linear layer in every quantization mode against the float
// baseline (perry FloatLinear bf16/f32) and external peers measured in the same run (oneDNN int8
// including its activation quantization, oneDNN and OpenBLAS bf16/f32).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace perry::bench {

struct BenchOpOptions {
  std::vector<std::string> modes;                       // quant modes; empty = all quantized modes
  std::vector<int64_t> ms;                              // rows M; empty = 1 16 128 512 1024 4096
  std::vector<std::pair<int64_t, int64_t>> shapes;      // (N, K); empty = the Llama-3/Qwen3-8B set
  int repeats = 0;                                      // timed runs per case (median); 0 = auto
  std::string out_prefix;                               // writes <prefix>.md and <prefix>.json
  bool quick = false;                                   // one shape, M in {1, 128, 512}, 3 repeats
};

// Prints a table and writes the markdown/JSON files; returns a process exit code.
int run_bench_op(const BenchOpOptions& opts);

}  // namespace perry::bench
