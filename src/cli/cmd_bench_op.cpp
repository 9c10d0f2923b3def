// perry bench-op: per-operator latency of every mode against the float baseline and peers.
// The measurement itself lives in src/bench/bench_op.cpp (layer perry_bench), and for
// --device cuda in src/backend/cuda/bench_op_cuda.cpp (perry_backend_cuda).
#include <cstdio>

#include "bench/bench_op.h"
#include "cli/common.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#ifdef PERRY_HAVE_CUDA
#include "backend/cuda/bench_op_cuda.h"
#endif

namespace perry::cli {

namespace {

// "10240x2560" → (N, K).
std::pair<int64_t, int64_t> parse_shape(const std::string& s) {
  long long n = 0, k = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%lldx%lld%c", &n, &k, &tail) != 2 || n <= 0 || k <= 0)
    fail("bench-op --shapes: expected NxK with positive N and K (e.g. 14336x4096), got '{}'", s);
  return {n, k};
}

}  // namespace

Command register_bench_op(CLI::App& root) {
  auto* o = new bench::BenchOpOptions();
  auto* threads = new int(0);
  auto* device = new std::string("cpu");
  auto* shapes = new std::vector<std::string>();
  auto* no_wgmma = new bool(false);
  auto* out_type = new std::string("bf16");
  CLI::App* app = root.add_subcommand(
      "bench-op", "Linear-layer latency of every mode vs bf16/fp32 and oneDNN/OpenBLAS (or, --device cuda, cuBLAS/cuBLASLt)");
  app->add_option("--modes", o->modes, "Quantized modes to measure (default: all; --device cpu runs w8a8-fp8 only when named)");
  app->add_option("-M,--m", o->ms, "Row counts M (default cpu: 1 16 128 512 1024 4096; cuda: 1 16 128 512 1024 2048 4096 8192)");
  app->add_option("--shapes", *shapes, "Weight shapes NxK, e.g. 14336x4096 4096x14336 (default: Llama-3-8B / 4B-class set)")
      ->delimiter(',');
  app->add_option("-r,--repeats", o->repeats, "Timed repetitions per case (median reported)");
  app->add_option("-o,--out", o->out_prefix, "Write OUT.md and OUT.json");
  app->add_flag("--quick", o->quick, "A short run: fewer shapes and repetitions");
  app->add_option("-t,--threads", *threads, "CPU threads (default: all cores)");
  app->add_option("--device", *device, "cpu (default) or cuda[:N]: perry's CUDA kernels vs cuBLAS / cuBLASLt");
  app->add_flag("--no-wgmma", *no_wgmma, "--device cuda: run the layers as PERRY_NO_WGMMA=1 does (no sm_90 int8 wgmma GEMMs)");
  app->add_option("--out-type", *out_type,
                  "--device cuda: what perry's layers write, bf16 (default: as the model's linears and the cuBLAS "
                  "bf16 baseline do) or f32");
  return {app, [o, threads, device, shapes, no_wgmma, out_type]() -> int {
    for (const auto& s : *shapes) o->shapes.push_back(parse_shape(s));
    if (*out_type != "bf16" && *out_type != "f32") fail("bench-op --out-type {}: expected bf16 or f32", *out_type);
    [[maybe_unused]] const DType float_out = *out_type == "bf16" ? DType::BF16 : DType::F32;
    const std::optional<int> dev = parse_device(*device);
    if (!dev) fail("--device {}: expected cpu, cuda or cuda:N", *device);
    if (*dev >= 0) {
#ifdef PERRY_HAVE_CUDA
      cuda::CudaBenchOpOptions co;
      co.common = *o;
      co.device = *dev;
      co.wgmma = !*no_wgmma;
      co.float_out = float_out;
      return cuda::run_bench_op_cuda(co);
#else
      fail("bench-op --device {}: this perry binary was built without the CUDA backend (nvcc was not found at "
           "configure time); use --device cpu or rebuild with the CUDA toolkit",
           *device);
#endif
    }
    if (*threads > 0) set_num_threads(*threads);
    return bench::run_bench_op(*o);
  }};
}

}  // namespace perry::cli
