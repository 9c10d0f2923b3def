// Device memory for the CUDA backend: every allocation goes through DevicePool (plain cudaMalloc,
// never managed memory), which counts what perry holds and turns an out-of-memory into an error
// that says how much was asked, what is free, and what to do. DeviceBuffer owns one allocation.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace perry::cuda {

class DevicePool {
 public:
  explicit DevicePool(int device);
  // `what` names the use ("weights of model.layers.3.mlp.down_proj", "KV cache") for the error.
  void* allocate(size_t bytes, const std::string& what);
  void release(void* p, size_t bytes);
  size_t in_use() const { return in_use_; }
  size_t peak() const { return peak_; }
  int device() const { return device_; }

 private:
  int device_;
  size_t in_use_ = 0, peak_ = 0;
};

// One owned device allocation (moves, never copies).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DevicePool& pool, size_t bytes, const std::string& what)
      : pool_(&pool), bytes_(bytes), p_(bytes ? pool.allocate(bytes, what) : nullptr) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = o.pool_;
      bytes_ = o.bytes_;
      p_ = o.p_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() {
    if (p_) pool_->release(p_, bytes_);
    p_ = nullptr;
    bytes_ = 0;
  }
  // Grows (discarding the contents) when smaller than `bytes`.
  void ensure(DevicePool& pool, size_t bytes, const std::string& what) {
    if (bytes_ >= bytes && p_) return;
    reset();
    *this = DeviceBuffer(pool, bytes, what);
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  DevicePool* pool_ = nullptr;
  size_t bytes_ = 0;
  void* p_ = nullptr;
};

// Uploads host bytes (synchronous; used at load time).
void copy_to_device(void* dst, const void* src, size_t bytes);

// "NVIDIA H200, 139.8 GiB (139.1 GiB free), sm_90, driver 13.0" — or throws perry::Error saying
// why no GPU can be used (no driver, no device, too old).
std::string describe_device(int device);
// Throws a clear perry::Error when CUDA cannot be used on this machine (before any allocation).
void require_device(int device);

std::string mib(size_t bytes);

}  // namespace perry::cuda
