// QuantizedLinear: holds the canonical weight plus the packed copy of the fastest kernel family
// this CPU supports, and picks GEMV or GEMM by the number of rows.
#include <atomic>
#include <mutex>
#include <fmt/format.h>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/op_profile.h"
#include "kernels/cpu/qgemm.h"
#include "quant/quant.h"

namespace perry::quant {

namespace {
std::atomic<bool> g_force_reference{false};

// Scratch for the online activation quantization; per calling thread so forward() is reentrant.
struct Scratch {
  AlignedBuffer<uint8_t> a;
  AlignedBuffer<float> sa;
  AlignedBuffer<int32_t> act_corr;
  AlignedBuffer<uint16_t> xb;
  AlignedBuffer<float> xf;  // also w8a8-fp8's decoded activations
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
template <typename T>
T* grow(AlignedBuffer<T>& b, size_t n) {
  if (b.size() < n) b.resize(n);
  return b.data();
}

prof::Counter& quantize_counter() {  // PERRY_PROFILE: the online activation quantization
  static prof::Counter c("linear/quantize activations");
  return c;
}

// Fp8Float: w8a8-fp8's emulation on the float GEMM (it picks its own ISA).
enum class Family { Reference, IntAvx512, IntAvx2, WoAvx512, WoAvx2, Fp8Float };
}  // namespace

void set_quant_force_reference(bool on) { g_force_reference = on; }
bool quant_force_reference() { return g_force_reference; }

namespace detail {
struct LinearImpl {
  QuantMode mode;
  int64_t N = 0, K = 0;
  // The canonical form is rebuilt from the packed copy on first use (canonical(), the reference
  // path), so a layer normally holds its weights once.
  mutable std::once_flag canon_once;
  mutable QuantizedWeight w;
  const QuantizedWeight& canon() const {
    std::call_once(canon_once, [this] {
      if (scheme.fp8) w = kernels::q::unpack_fp8(pfp8);
      else w = scheme.int8_activations ? kernels::q::unpack_int(pint, mode) : kernels::q::unpack_wo(pwo, mode);
    });
    return w;
  }
  QuantScheme scheme;
  // The CPU kernels' layout, built at construction or — for a layer constructed for a device
  // backend, which reads the canonical form — on the first CPU forward.
  mutable std::once_flag pack_once;
  mutable kernels::q::PackedInt pint;
  mutable kernels::q::PackedWo pwo;
  mutable kernels::q::PackedFp8 pfp8;
  void ensure_packed() const {
    std::call_once(pack_once, [this] { pack(w); });
  }
  // Exactly one packed form per mode (fp8 first: its scheme also reads as 8-bit, float activations).
  void pack(const QuantizedWeight& from) const {
    if (scheme.fp8) pfp8 = kernels::q::pack_fp8(from);
    else if (scheme.int8_activations) pint = kernels::q::pack_int(from);
    else pwo = kernels::q::pack_wo(from);
  }
  // M <= gemv_max_m runs the matrix-vector kernel. Measured with `perry bench-op` on the Zen 4
  // dev VM (docs/perf/cpu-quant-kernels.md): the GEMM's register tile wins from 2 rows on.
  int64_t gemv_max_m = 1;

  // Evaluated per call so PERRY_FORCE_ISA / set_max_isa / set_quant_force_reference apply at once.
  Family family() const {
    if (g_force_reference) return Family::Reference;
    if (scheme.fp8) return Family::Fp8Float;
    if (scheme.int8_activations) {
      if (supports_avx512_vnni()) return Family::IntAvx512;
      if (supports_avx2()) return Family::IntAvx2;
      return Family::Reference;
    }
    if (supports_avx512_bf16()) return Family::WoAvx512;
    if (supports_avx2()) return Family::WoAvx2;
    return Family::Reference;
  }
};
}  // namespace detail

QuantizedLinear::QuantizedLinear(QuantizedWeight w, bool pack_for_cpu) : impl_(std::make_unique<detail::LinearImpl>()) {
  w.validate();
  impl_->scheme = quant_scheme(w.mode);
  impl_->mode = w.mode;
  impl_->N = w.N;
  impl_->K = w.K;
  if (pack_for_cpu) {
    impl_->pack(w);
    std::call_once(impl_->pack_once, [] {});
  } else {
    // Canonical only (a device backend uploads it); packed lazily if the CPU ever runs it.
    impl_->w = std::move(w);
    std::call_once(impl_->canon_once, [] {});
  }
}
QuantizedLinear::~QuantizedLinear() = default;
QuantizedLinear::QuantizedLinear(QuantizedLinear&&) noexcept = default;
QuantizedLinear& QuantizedLinear::operator=(QuantizedLinear&&) noexcept = default;

const QuantizedWeight& QuantizedLinear::canonical() const { return impl_->canon(); }
int64_t QuantizedLinear::rows() const { return impl_->N; }
int64_t QuantizedLinear::cols() const { return impl_->K; }
QuantMode QuantizedLinear::mode() const { return impl_->mode; }
int64_t QuantizedLinear::gemv_max_m() const { return impl_->gemv_max_m; }

std::string QuantizedLinear::kernel_name(int64_t M) const {
  const bool gemv = M <= impl_->gemv_max_m;
  std::string_view mode = quant_mode_name(impl_->mode);
  switch (impl_->family()) {
    case Family::IntAvx512: return fmt::format("{}:{}_avx512_vnni", mode, gemv ? "gemv" : "gemm");
    case Family::IntAvx2: return fmt::format("{}:{}_avx2", mode, gemv ? "gemv" : "gemm");
    case Family::WoAvx512: return fmt::format("{}:{}_avx512_bf16", mode, gemv ? "gemv" : "gemm");
    case Family::WoAvx2: return fmt::format("{}:gemm_avx2", mode);  // one loop for every M
    case Family::Fp8Float: return kernels::q::fp8_kernel_name(impl_->N, impl_->K, M);
    case Family::Reference: break;
  }
  return fmt::format("{}:reference", mode);
}

void QuantizedLinear::forward(const float* x, int64_t M, float* y, const float* bias) const {
  namespace kq = kernels::q;
  PERRY_CHECK(M >= 0, "QuantizedLinear::forward: negative row count {}", M);
  if (M == 0) return;
  const auto& I = *impl_;
  if (I.family() != Family::Reference) I.ensure_packed();
  const int64_t K = I.K;
  const kq::Path path = M <= I.gemv_max_m && M <= kq::kGemvMaxRows ? kq::Path::Gemv : kq::Path::Gemm;
  Scratch& s = scratch();
  switch (I.family()) {
    case Family::IntAvx512: {
      const kq::avx512::ActBuffers act{grow(s.a, size_t(M * I.pint.lda())), grow(s.sa, size_t(M)),
                                       grow(s.act_corr, size_t(M * I.pint.G))};
      {
        prof::Scope t(quantize_counter());
        kq::avx512::quantize_activations(I.pint, x, M, act);
      }
      kq::avx512::int_forward(I.pint, act.a, act.act_corr, M, act.sa, y, bias, path);
      return;
    }
    case Family::IntAvx2: {
      const int64_t lda = I.pint.lda();
      int8_t* a = reinterpret_cast<int8_t*>(grow(s.a, size_t(M * lda)));
      float* sa = grow(s.sa, size_t(M));
      kq::avx2::quantize_rows_s8(x, M, K, a, lda, sa);
      kq::avx2::int_forward(I.pint, a, M, sa, y, bias, path);
      return;
    }
    case Family::WoAvx512: {
      const int64_t ldx = I.pwo.ldx();
      uint16_t* xb = grow(s.xb, size_t(M * ldx));
      kq::avx512::to_bf16_rows(x, M, K, xb, ldx);
      kq::avx512::wo_forward(I.pwo, xb, M, y, bias, path);
      return;
    }
    case Family::WoAvx2: {
      const int64_t ldx = I.pwo.ldx();
      float* xf = grow(s.xf, size_t(M * ldx));
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t k = 0; k < K; ++k) xf[m * ldx + k] = bf16_to_f32(f32_to_bf16(x[m * K + k]));
        for (int64_t k = K; k < ldx; ++k) xf[m * ldx + k] = 0.0f;
      }
      kq::avx2::wo_forward(I.pwo, xf, M, y, bias);
      return;
    }
    case Family::Fp8Float: {
      float* xq = grow(s.xf, size_t(M * K));
      float* sa = grow(s.sa, size_t(M));
      {
        prof::Scope t(quantize_counter());
        kq::quantize_rows_fp8(x, M, K, xq, sa);
      }
      kq::fp8_forward(I.pfp8, xq, sa, M, y, bias);
      return;
    }
    case Family::Reference:
      if (I.scheme.fp8) {
        kq::ref::fp8_forward(I.canon(), x, M, y, bias);
      } else if (I.scheme.int8_activations) {
        kq::ref::int_forward(I.canon(), x, M, y, bias);
      } else {
        kq::ref::wo_forward(I.canon(), x, M, y, bias);
      }
      return;
  }
}

void QuantizedLinear::forward_many(const QuantizedLinear* const* layers, int n, const float* x, int64_t M,
                                   float* const* y, const float* const* bias) {
  namespace kq = kernels::q;
  PERRY_CHECK(n >= 1 && n <= 4, "QuantizedLinear::forward_many: {} layers (1..4)", n);
  PERRY_CHECK(M >= 0, "QuantizedLinear::forward_many: negative row count {}", M);
  if (M == 0) return;
  const auto& I0 = *layers[0]->impl_;
  bool shared = I0.family() == Family::IntAvx512;
  for (int i = 1; i < n && shared; ++i) {
    const auto& I = *layers[i]->impl_;
    shared = I.mode == I0.mode && I.K == I0.K && I.gemv_max_m == I0.gemv_max_m;
  }
  if (!shared) {
    for (int i = 0; i < n; ++i) layers[i]->forward(x, M, y[i], bias ? bias[i] : nullptr);
    return;
  }
  const kq::PackedInt* p[4];
  for (int i = 0; i < n; ++i) {
    layers[i]->impl_->ensure_packed();
    p[i] = &layers[i]->impl_->pint;
  }
  const kq::Path path = M <= I0.gemv_max_m && M <= kq::kGemvMaxRows ? kq::Path::Gemv : kq::Path::Gemm;
  Scratch& s = scratch();
  const kq::avx512::ActBuffers act{grow(s.a, size_t(M * p[0]->lda())), grow(s.sa, size_t(M)),
                                   grow(s.act_corr, size_t(M * p[0]->G))};
  {
    prof::Scope t(quantize_counter());
    kq::avx512::quantize_activations(*p[0], x, M, act);
  }
  kq::avx512::int_forward_many(p, n, act.a, act.act_corr, M, act.sa, y, bias, path);
}

}  // namespace perry::quant
