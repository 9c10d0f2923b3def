// perry bench-op: per-operator latency of every mode against the float baseline and peers.
// The measurement itself lives in src/bench/bench_op.cpp (layer perry_bench).
#include "bench/bench_op.h"
#include "cli/common.h"
#include "core/thread_pool.h"

namespace perry::cli {

Command register_bench_op(CLI::App& root) {
  auto* o = new bench::BenchOpOptions();
  auto* threads = new int(0);
  CLI::App* app = root.add_subcommand("bench-op", "Linear-layer latency of every mode vs bf16/fp32 and oneDNN/OpenBLAS");
  app->add_option("--modes", o->modes, "Modes to measure (default: all)");
  app->add_option("-M,--m", o->ms, "Row counts M (default 1 16 128 512 1024 4096)");
  app->add_option("-r,--repeats", o->repeats, "Timed repetitions per case (median reported)");
  app->add_option("-o,--out", o->out_prefix, "Write OUT.md and OUT.json");
  app->add_flag("--quick", o->quick, "A short run: fewer shapes and repetitions");
  app->add_option("-t,--threads", *threads, "CPU threads (default: all cores)");
  return {app, [o, threads]() -> int {
    if (*threads > 0) set_num_threads(*threads);
    return bench::run_bench_op(*o);
  }};
}

}  // namespace perry::cli
