#include "model/kv_cache.h"

#include "core/error.h"

namespace perry::model {

KvCache::KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, int64_t n_slots)
    : n_layers_(n_layers), n_kv_(n_kv_heads), hd_(head_dim), capacity_(capacity), slots_(size_t(n_slots)) {}

void KvCache::ensure(int64_t slot) {
  PERRY_CHECK(slot >= 0 && slot < n_slots(), "KV cache slot {} out of range (have {})", slot, n_slots());
  Slot& s = slots_[size_t(slot)];
  if (s.k.size() == 0) {
    const size_t n = size_t(n_layers_ * n_kv_ * capacity_ * hd_);
    try {
      s.k.resize(n);
      s.v.resize(n);
    } catch (const std::bad_alloc&) {
      fail("out of memory allocating the KV cache ({:.1f} MiB per sequence for context {}); use a smaller --ctx",
           double(2 * n * sizeof(float)) / (1 << 20), capacity_);
    }
  }
}

void KvCache::set_length(int64_t slot, int64_t n) {
  PERRY_CHECK(slot >= 0 && slot < n_slots(), "KV cache slot {} out of range", slot);
  PERRY_CHECK(n >= 0 && n <= slots_[size_t(slot)].length, "KV cache: cannot extend slot {} by truncation", slot);
  slots_[size_t(slot)].length = n;
}

size_t KvCache::allocated_bytes() const {
  size_t b = 0;
  for (const auto& s : slots_) b += (s.k.size() + s.v.size()) * sizeof(float);
  return b;
}

float* KvCache::keys(int64_t slot, int64_t layer) {
  ensure(slot);
  return slots_[size_t(slot)].k.data() + size_t(layer * n_kv_ * capacity_ * hd_);
}

float* KvCache::values(int64_t slot, int64_t layer) {
  ensure(slot);
  return slots_[size_t(slot)].v.data() + size_t(layer * n_kv_ * capacity_ * hd_);
}

}  // namespace perry::model
