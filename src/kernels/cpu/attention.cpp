// Attention driver (work split, merge of partial softmax states) and the scalar references.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace perry::kernels {
namespace {

constexpr int64_t kMinKeysPerChunk = 256;  // below this a split costs more in merging than it saves

void check_shapes(int64_t T, int64_t pos0, int n_heads, int n_kv_heads, int hd, int64_t capacity) {
  PERRY_CHECK(T >= 0 && pos0 >= 0, "attention_f32: bad T={} pos0={}", T, pos0);
  PERRY_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
              "attention_f32: n_heads {} must be a positive multiple of n_kv_heads {}", n_heads, n_kv_heads);
  PERRY_CHECK(hd > 0, "attention_f32: head_dim {} must be positive", hd);
  PERRY_CHECK(pos0 + T <= capacity, "attention_f32: positions up to {} exceed the KV cache capacity {}",
              pos0 + T, capacity);
}

}  // namespace

namespace ref {

void attention_f32(const float* q, int64_t T, int64_t pos0, int n_heads, int n_kv_heads, int hd,
                   const float* k_cache, const float* v_cache, int64_t capacity, float scale, float* out) {
  check_shapes(T, pos0, n_heads, n_kv_heads, hd, capacity);
  const int group = n_heads / n_kv_heads;
  std::vector<float> s(size_t(pos0 + T));
  std::vector<double> o(static_cast<size_t>(hd));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t L = pos0 + t + 1;
    for (int h = 0; h < n_heads; ++h) {
      const float* qv = q + (t * n_heads + h) * hd;
      const float* k = k_cache + int64_t(h / group) * capacity * hd;
      const float* v = v_cache + int64_t(h / group) * capacity * hd;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < L; ++j) {
        float d = 0;
        for (int i = 0; i < hd; ++i) d += qv[i] * k[j * hd + i];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < L; ++j) {
        double p = std::exp(double(s[j] - mx));
        sum += p;
        for (int i = 0; i < hd; ++i) o[i] += p * v[j * hd + i];
      }
      float* ov = out + (t * n_heads + h) * hd;
      for (int i = 0; i < hd; ++i) ov[i] = float(o[i] / sum);
    }
  }
}

void attend_chunk(const float* qg, int G, int hd, const float* k, const float* v, int64_t j0, int64_t j1,
                  float scale, float* m, float* l, float* acc) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* kj = k + j * hd;
    const float* vj = v + j * hd;
    for (int g = 0; g < G; ++g) {
      const float* qv = qg + g * hd;
      float d = 0;
      for (int i = 0; i < hd; ++i) d += qv[i] * kj[i];
      d *= scale;
      float* a = acc + g * hd;
      if (d > m[g]) {  // new running max: rescale what was accumulated so far
        float c = std::exp(m[g] - d);
        l[g] *= c;
        for (int i = 0; i < hd; ++i) a[i] *= c;
        m[g] = d;
      }
      float p = std::exp(d - m[g]);
      l[g] += p;
      for (int i = 0; i < hd; ++i) a[i] += p * vj[i];
    }
  }
}

}  // namespace ref

void attention_f32(const float* q, int64_t T, int64_t pos0, int n_heads, int n_kv_heads, int hd,
                   const float* k_cache, const float* v_cache, int64_t capacity, float scale, float* out) {
  check_shapes(T, pos0, n_heads, n_kv_heads, hd, capacity);
  if (T == 0) return;
  const AttendChunkFn attend = supports_avx512() ? &avx512::attend_chunk : &ref::attend_chunk;
  const int G = n_heads / n_kv_heads;
  ThreadPool& pool = thread_pool();
  const int threads = pool.size();

  // Items: (query t, kv head, key chunk). Split keys only when (query, kv head) pairs alone can't
  // keep every thread busy (decode with few kv heads) and the context is long enough to be worth it.
  const int64_t pairs = T * n_kv_heads;
  int64_t chunks = 1;
  if (pairs < 4 * threads) {
    int64_t want = (4 * threads + pairs - 1) / pairs;
    chunks = std::clamp<int64_t>((pos0 + 1) / kMinKeysPerChunk, 1, want);
  }
  const int64_t items = pairs * chunks;
  const int64_t state = int64_t(G) * (2 + hd);  // m[G], l[G], acc[G, hd]
  std::vector<float> partial(size_t(items * state));

  std::atomic<int64_t> next{0};
  auto work = [&](int, int) {
    for (;;) {
      int64_t it = next.fetch_add(1, std::memory_order_relaxed);
      if (it >= items) return;
      // Longest rows first (t descending) so the causal triangle balances across threads.
      const int64_t c = it % chunks, pair = it / chunks;
      const int64_t t = T - 1 - pair / n_kv_heads;
      const int kvh = int(pair % n_kv_heads);
      const int64_t L = pos0 + t + 1;
      const int64_t j0 = L * c / chunks, j1 = L * (c + 1) / chunks;
      float* st = partial.data() + it * state;
      float *m = st, *l = st + G, *acc = st + 2 * G;
      std::fill(m, m + G, -std::numeric_limits<float>::infinity());
      std::fill(l, l + G + int64_t(G) * hd, 0.0f);
      const float* qg = q + (t * n_heads + int64_t(kvh) * G) * hd;
      const float* k = k_cache + int64_t(kvh) * capacity * hd;
      const float* v = v_cache + int64_t(kvh) * capacity * hd;
      if (j1 > j0) attend(qg, G, hd, k, v, j0, j1, scale, m, l, acc);
      if (chunks == 1) {
        float* o = out + (t * n_heads + int64_t(kvh) * G) * hd;
        for (int g = 0; g < G; ++g) {
          float inv = 1.0f / l[g];
          for (int i = 0; i < hd; ++i) o[g * hd + i] = acc[g * hd + i] * inv;
        }
      }
    }
  };
  if (items == 1 || threads == 1)
    work(0, 1);
  else
    pool.run_on_all(work);
  if (chunks == 1) return;

  // Merge the chunk states of each (t, kv head): rescale each by exp(m_c - max m).
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t t = T - 1 - pair / n_kv_heads;
    const int kvh = int(pair % n_kv_heads);
    float* o = out + (t * n_heads + int64_t(kvh) * G) * hd;
    for (int g = 0; g < G; ++g) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < chunks; ++c) mx = std::max(mx, partial[size_t((pair * chunks + c) * state + g)]);
      float lsum = 0;
      std::fill(o + g * hd, o + (g + 1) * hd, 0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const float* st = partial.data() + (pair * chunks + c) * state;
        if (st[G + g] == 0.0f) continue;  // empty chunk
        float w = std::exp(st[g] - mx);
        lsum += st[G + g] * w;
        const float* acc = st + 2 * G + int64_t(g) * hd;
        for (int i = 0; i < hd; ++i) o[g * hd + i] += acc[i] * w;
      }
      float inv = 1.0f / lsum;
      for (int i = 0; i < hd; ++i) o[g * hd + i] *= inv;
    }
  }
}

}  // namespace perry::kernels
