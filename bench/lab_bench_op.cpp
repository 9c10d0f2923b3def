// Runs perry::bench::run_bench_op (the code behind `perry bench-op`) linked against the kernels
// layer only, so the quant kernels can be measured while the rest of the tree is mid-change.
// Usage: lab_bench_op [--quick] [-o PREFIX] [-r REPEATS] [--modes a,b] [--ms 1,128] [--shape NxK]...
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "bench/bench_op.h"
#include "core/error.h"

static std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(t);
  return out;
}

int main(int argc, char** argv) {
  perry::bench::BenchOpOptions o;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) perry::fail("{} needs a value", a);
        return argv[++i];
      };
      if (a == "--quick") {
        o.quick = true;
      } else if (a == "-o") {
        o.out_prefix = next();
      } else if (a == "-r") {
        o.repeats = std::stoi(next());
      } else if (a == "--modes") {
        o.modes = split(next());
      } else if (a == "--ms") {
        for (auto& m : split(next())) o.ms.push_back(std::stoll(m));
      } else if (a == "--shape") {
        std::string s = next();
        auto x = s.find('x');
        if (x == std::string::npos) perry::fail("--shape wants NxK, got '{}'", s);
        o.shapes.emplace_back(std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1)));
      } else {
        perry::fail("unknown argument '{}'", a);
      }
    }
    return perry::bench::run_bench_op(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lab_bench_op: %s\n", e.what());
    return 1;
  }
}
