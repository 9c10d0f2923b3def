// A small persistent thread pool for the kernels. The calling thread takes part in the work,
// workers spin briefly before sleeping so back-to-back decode kernels don't pay a wake-up each.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace perry {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Runs fn(thread_index, n_threads) once on every thread of the pool (caller is index 0).
  void run_on_all(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks of at least `grain` items, one chunk per thread.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  // Like parallel_for, but each thread walks its own contiguous range in chunks of `chunk` items
  // from the front and, once done, takes chunks from the back of the ranges still unfinished. The
  // streams stay sequential (memory order) while a thread that started late or was preempted —
  // common on a shared VM — no longer holds up the others for its whole share.
  void parallel_for_balanced(size_t n, size_t chunk, const std::function<void(size_t, size_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

// The process-wide pool (size: PERRY_THREADS or hardware concurrency).
ThreadPool& thread_pool();
void set_num_threads(int n);  // recreates the global pool; call before heavy work

}  // namespace perry
