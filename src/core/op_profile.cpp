#include "core/op_profile.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "core/env.h"

namespace perry::prof {

namespace {
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::vector<Counter*>& registry() {
  static std::vector<Counter*> r;
  return r;
}
std::atomic<int> g_phase{int(Phase::Prefill)};
}  // namespace

bool enabled() {
  static const bool on = env_flag("PERRY_PROFILE");
  return on;
}

void set_phase(Phase p) { g_phase.store(int(p), std::memory_order_relaxed); }
Phase phase() { return Phase(g_phase.load(std::memory_order_relaxed)); }

Counter::Counter(const char* name) : name_(name) {
  std::lock_guard<std::mutex> lk(registry_mu());
  registry().push_back(this);
}

void count(Counter& c) {
  if (enabled()) c.add(0, 0);
}

void report(std::FILE* f, const char* title) {
  std::lock_guard<std::mutex> lk(registry_mu());
  const char* phase_name[2] = {"decode (1 row per forward)", "prefill (>1 row per forward)"};
  for (int p = 0; p < 2; ++p) {
    const Counter* fwd = nullptr;
    for (const Counter* c : registry())
      if (std::strcmp(c->name_, "forward") == 0) fwd = c;
    const int64_t n_fwd = fwd ? fwd->calls_[p].load() : 0;
    if (n_fwd == 0) continue;
    const double fwd_ms = double(fwd->ns_[p].load()) / 1e6 / double(n_fwd);
    std::fprintf(f, "[profile] %s — %s: %lld forwards, %.3f ms each\n", title, phase_name[p], (long long)n_fwd, fwd_ms);
    std::fprintf(f, "[profile]   %-28s %10s %12s %8s %9s\n", "op", "calls/fwd", "ms/fwd", "% fwd", "GB/s");
    double covered = 0;
    for (const Counter* c : registry()) {
      if (c == fwd || c->calls_[p].load() == 0) continue;
      const double ms = double(c->ns_[p].load()) / 1e6 / double(n_fwd);
      const double calls = double(c->calls_[p].load()) / double(n_fwd);
      const int64_t bytes = c->bytes_[p].load();
      const bool sub = std::strchr(c->name_, '/') != nullptr;  // "linear/quantize": inside another op
      const bool event = c->ns_[p].load() == 0;
      if (!sub && !event) covered += ms;
      char gbs[32] = "";
      if (bytes && c->ns_[p].load() > 0) std::snprintf(gbs, sizeof gbs, "%.1f", double(bytes) / double(c->ns_[p].load()));
      std::fprintf(f, "[profile]   %-28s %10.2f %12.4f %8.1f %9s\n", c->name_, calls, ms, 100.0 * ms / fwd_ms, gbs);
    }
    std::fprintf(f, "[profile]   %-28s %10s %12.4f %8.1f\n", "(not covered)", "", fwd_ms - covered,
                 100.0 * (fwd_ms - covered) / fwd_ms);
  }
}

void reset() {
  std::lock_guard<std::mutex> lk(registry_mu());
  for (Counter* c : registry())
    for (int p = 0; p < 2; ++p) {
      c->ns_[p] = 0;
      c->calls_[p] = 0;
      c->bytes_[p] = 0;
    }
}

}  // namespace perry::prof
