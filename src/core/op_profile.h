// Per-op wall-time profile of the forward pass, switched on by the environment variable
// PERRY_PROFILE (any value but "0"). Off, a scope costs one predictable branch.
//
// Call sites own a static Counter ("attn.q_proj", ...) and open a Scope around the op; times are
// kept separately for decode forwards (one row) and the rest (prefill), because the per-token
// fixed costs only show in the former. `perry bench` prints the table after each mode.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace perry::prof {

bool enabled();

enum class Phase : int { Decode = 0, Prefill = 1 };
void set_phase(Phase p);
Phase phase();

class Counter {
 public:
  explicit Counter(const char* name);  // registers itself; the name must outlive the counter
  void add(int64_t ns, int64_t bytes) {
    const int p = int(phase());
    ns_[p].fetch_add(ns, std::memory_order_relaxed);
    calls_[p].fetch_add(1, std::memory_order_relaxed);
    if (bytes) bytes_[p].fetch_add(bytes, std::memory_order_relaxed);
  }
  const char* name() const { return name_; }

 private:
  friend void report(std::FILE*, const char*);
  friend void reset();
  const char* name_;
  std::atomic<int64_t> ns_[2]{}, calls_[2]{}, bytes_[2]{};
};

// Times its lifetime into `c` when profiling is on. `bytes` (weights streamed) gives a GB/s column.
class Scope {
 public:
  explicit Scope(Counter& c, int64_t bytes = 0) : c_(enabled() ? &c : nullptr), bytes_(bytes) {
    if (c_) t0_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (c_) c_->add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count(), bytes_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Counter* c_;
  int64_t bytes_;
  std::chrono::steady_clock::time_point t0_;
};

// Counts one event (no time), e.g. a thread-pool dispatch.
void count(Counter& c);

// Prints every counter with calls, ms per forward ("forward" counter) and GB/s; then the
// remainder of the forward time that no top-level counter covers.
void report(std::FILE* f, const char* title);
void reset();

}  // namespace perry::prof
