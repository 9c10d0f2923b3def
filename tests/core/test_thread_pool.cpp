// ThreadPool: every item of a parallel loop runs exactly once, whatever the split.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace {

// Runs `loop` over n items and checks each index was visited exactly once, in chunks that are
// contiguous, non-empty and (for the balanced split) at most `chunk` long.
template <typename Loop>
void expect_each_item_once(size_t n, size_t max_chunk, Loop&& loop) {
  std::vector<std::atomic<int>> seen(n);
  for (auto& s : seen) s = 0;
  std::atomic<int> bad_chunks{0};
  loop([&](size_t b, size_t e) {
    if (b >= e || e > n || (max_chunk && e - b > max_chunk)) bad_chunks++;
    for (size_t i = b; i < e && i < n; ++i) seen[i]++;
  });
  EXPECT_EQ(bad_chunks.load(), 0) << "n=" << n;
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << "item " << i << " of " << n;
}

}  // namespace

TEST(ThreadPool, BalancedLoopVisitsEveryItemOnce) {
  for (int threads : {1, 2, 3, 5}) {
    perry::ThreadPool pool(threads);
    for (size_t n : {size_t(1), size_t(2), size_t(7), size_t(64), size_t(1000), size_t(8017)})
      for (size_t chunk : {size_t(1), size_t(3), size_t(16), size_t(5000)})
        expect_each_item_once(n, chunk, [&](const std::function<void(size_t, size_t)>& fn) {
          pool.parallel_for_balanced(n, chunk, fn);
        });
  }
}

// A thread that stalls in its first chunk (as if preempted) has the rest of its range done by the
// other thread: the stalled chunk waits until every other item has run, which without the
// takeover would never happen (the guard below only turns that hang into a failure).
TEST(ThreadPool, BalancedLoopTakesOverAStalledThreadsRange) {
  perry::ThreadPool pool(2);
  const size_t n = 64, chunk = 4;
  std::vector<std::atomic<int>> seen(n);
  for (auto& s : seen) s = 0;
  std::atomic<bool> gave_up{false};
  auto all_seen = [&] {
    for (size_t i = 0; i < n; ++i)
      if (!seen[i].load()) return false;
    return true;
  };
  pool.parallel_for_balanced(n, chunk, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) seen[i]++;
    if (b != n / 2) return;  // [32, 36): the second thread's first chunk
    const auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!all_seen()) {
      if (std::chrono::steady_clock::now() > guard) {
        gave_up = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_FALSE(gave_up.load()) << "the stalled thread's range was not taken over";
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << i;
}

TEST(ThreadPool, PlainLoopVisitsEveryItemOnce) {
  perry::ThreadPool pool(3);
  for (size_t n : {size_t(1), size_t(5), size_t(1000)})
    expect_each_item_once(n, 0, [&](const std::function<void(size_t, size_t)>& fn) { pool.parallel_for(n, 1, fn); });
}

TEST(ThreadPool, BalancedLoopRejectsMoreThan32BitItems) {
  perry::ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for_balanced(size_t(1) << 33, size_t(1) << 31, [](size_t, size_t) {}), perry::Error);
}
