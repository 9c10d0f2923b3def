// KV cache: one slot per live sequence. Per layer and slot, keys and values are laid out
// [n_kv_heads][capacity][head_dim] so attention streams one head's history contiguously.
// Slots are allocated on first use, so a server with many slots only pays for what it uses.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/aligned_buffer.h"

namespace perry::model {

class KvCache {
 public:
  KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, int64_t n_slots);

  int64_t capacity() const { return capacity_; }
  int64_t n_slots() const { return int64_t(slots_.size()); }
  int64_t length(int64_t slot) const { return slots_[size_t(slot)].length; }
  void set_length(int64_t slot, int64_t n);  // truncate (n <= length) — e.g. reuse a prompt prefix
  void reset(int64_t slot) { set_length(slot, 0); }
  size_t bytes_per_token() const { return size_t(n_layers_ * n_kv_ * hd_ * 2) * sizeof(float); }
  size_t allocated_bytes() const;

  // Host storage (CPU backend). A device backend keeps its own storage in backend_state() and
  // never calls these, so no host memory is taken for its cache.
  float* keys(int64_t slot, int64_t layer);    // [n_kv][capacity][hd]
  float* values(int64_t slot, int64_t layer);
  void advance(int64_t slot, int64_t n) { slots_[size_t(slot)].length += n; }

  // Opaque per-cache state of a device backend (its KV storage), created on first forward.
  const std::shared_ptr<void>& backend_state() const { return backend_state_; }
  void set_backend_state(std::shared_ptr<void> s) { backend_state_ = std::move(s); }
  int64_t n_layers() const { return n_layers_; }
  int64_t n_kv_heads() const { return n_kv_; }
  int64_t head_dim() const { return hd_; }

 private:
  struct Slot {
    AlignedBuffer<float> k, v;  // [n_layers][n_kv][capacity][hd]
    int64_t length = 0;
  };
  void ensure(int64_t slot);
  int64_t n_layers_, n_kv_, hd_, capacity_;
  std::vector<Slot> slots_;
  std::shared_ptr<void> backend_state_;
};

}  // namespace perry::model
