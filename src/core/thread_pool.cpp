#include "core/thread_pool.h"

#include "core/error.h"
#include "core/op_profile.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace perry {

ThreadPool::ThreadPool(int threads) {
  threads = std::max(1, threads);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little (cheap on an idle core), then sleep on the condition variable.
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < 20000) {
      _mm_pause();
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    (*job_)(index, size());
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  if (workers_.empty()) {
    fn(0, 1);
    return;
  }
  static prof::Counter dispatches("pool dispatches (count)"), wait("pool/caller waits for workers");
  prof::count(dispatches);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    pending_.store(int(workers_.size()), std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  fn(0, size());
  prof::Scope waiting(wait);
  while (pending_.load(std::memory_order_acquire) != 0) _mm_pause();
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  size_t max_chunks = (n + grain - 1) / grain;
  int nt = int(std::min<size_t>(size_t(size()), max_chunks));
  if (nt <= 1) {
    fn(0, n);
    return;
  }
  run_on_all([&](int t, int) {
    if (t >= nt) return;
    size_t begin = n * size_t(t) / size_t(nt), end = n * size_t(t + 1) / size_t(nt);
    if (begin < end) fn(begin, end);
  });
}

void ThreadPool::parallel_for_balanced(size_t n, size_t chunk,
                                       const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  chunk = std::max<size_t>(1, chunk);
  const int nt = int(std::min<size_t>(size_t(size()), (n + chunk - 1) / chunk));
  if (nt <= 1) {
    for (size_t b = 0; b < n; b += chunk) fn(b, std::min(n, b + chunk));
    return;
  }
  // Range of thread t: [front, back) packed in one 64-bit word (front low, back high) so the owner
  // (front += chunk) and a thief (back -= chunk) claim with one compare-exchange each.
  constexpr int kMaxThreads = 64;
  PERRY_CHECK(nt <= kMaxThreads && n < (size_t(1) << 32), "parallel_for_balanced: {} items on {} threads", n, nt);
  struct alignas(64) Range {
    std::atomic<uint64_t> fb;
  };
  Range ranges[kMaxThreads];
  for (int t = 0; t < nt; ++t) {
    const uint64_t b = n * size_t(t) / size_t(nt), e = n * size_t(t + 1) / size_t(nt);
    ranges[t].fb.store(b | (e << 32), std::memory_order_relaxed);
  }
  // Claims up to `chunk` items of range r from its front (owner) or back (thief); false if empty.
  auto claim = [&](int r, bool from_front, size_t& b, size_t& e) {
    uint64_t cur = ranges[r].fb.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t f = cur & 0xFFFFFFFFu, k = cur >> 32;
      if (f >= k) return false;
      const uint64_t take = std::min<uint64_t>(chunk, k - f);
      const uint64_t next = from_front ? ((f + take) | (k << 32)) : (f | ((k - take) << 32));
      if (ranges[r].fb.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
        b = from_front ? f : k - take;
        e = from_front ? f + take : k;
        return true;
      }
    }
  };
  run_on_all([&](int t, int) {
    if (t >= nt) return;
    size_t b, e;
    while (claim(t, true, b, e)) fn(b, e);
    for (int d = 1; d < nt; ++d)
      while (claim((t + d) % nt, false, b, e)) fn(b, e);
  });
}

namespace {
std::unique_ptr<ThreadPool>& global_pool() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
int default_threads() {
  if (const char* e = std::getenv("PERRY_THREADS")) {
    int n = std::atoi(e);
    if (n > 0) return n;
  }
  return int(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

ThreadPool& thread_pool() {
  auto& p = global_pool();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

void set_num_threads(int n) { global_pool() = std::make_unique<ThreadPool>(n > 0 ? n : default_threads()); }

}  // namespace perry
