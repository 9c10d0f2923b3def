// `perry bench-op --device cuda` (see bench_op_cuda.h).
//
// Method, per weight shape [N, K] and row count M:
//   - every op (bench_op_cuda_ops.h) reads fresh random data (never zeros). Weights live in
//     several copies per storage format (bf16 / int8 / int4 / e4m3, with their scales); each call
//     takes the next copy, and the copies of a format add up to more than 4× the L2 size, so no
//     timed call finds its weights in L2 (activations stay one buffer per M: a layer's input was
//     just written by the previous kernel, so it is L2-warm in a real forward as well);
//   - rounds: a spin kernel holds the stream while the host queues one call of every op, each
//     between two CUDA events, so no timing includes host launch latency; warm-up rounds, then
//     the median over the timed rounds (ops interleaved, so clock drift hits all alike);
//   - perry's rows run the kernels CudaLinear picks at that M (linear_path, cuda_linear.h) with
//     its arguments; w8a8-mma, where w8a8 picks the sm_90 wgmma GEMM, times the mma.sync one; at
//     M = 1 they run the decode step's kernel instead (gemv_decode, decode_kernel_row) in o_proj's
//     form: the fp32 row in (quantized or converted to bf16 inside the kernel, so one timing per
//     op, no `gemm ms` apart), the product added to y;
//   - perry's W*A8 rows include quantize_per_token of the bf16 activation (w8a8-fp8:
//     quantize_per_token_fp8, as CudaLinear runs it); their GEMM alone and the quantization alone
//     are timed as well (columns `gemm ms`, `quant ms`; rows `quantize`, `quantize-fp8`);
//   - after timing, every op runs once more on copy 0 and 8×8 sampled outputs are compared with
//     a float64 / integer host reference (bench_op_cuda_ops.cpp); a startup check at one small
//     shape runs perry's modes on weights from perry's CPU quantizer. Failing rows are marked.
//   - M = 1 GB/s = weight (+ scale) bytes / time, against the device copy bandwidth measured in
//     the same run (cudaMemcpy device-to-device of 1 GiB, read + write bytes / time); the decode
//     kernel and cuBLAS bf16 are also timed kChainCalls calls back to back (Row::chain_ms), and
//     at 2..kChainMaxM rows every perry op's GEMM and cuBLAS bf16 alike.
#include "backend/cuda/bench_op_cuda.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "backend/cuda/bench_op_cuda_ops.h"
#include "backend/cuda/device_memory.h"
#include "core/error.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_quant_sm90.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/two_level_scales.h"

namespace perry::cuda {

namespace {

using namespace benchop;
namespace pq = perry::quant;
using Clock = std::chrono::steady_clock;

struct Row {
  int N = 0, K = 0, M = 0;
  std::string variant, kind, kernel, check = "not checked";
  bool ok = true;
  double ms = -1, gemm_ms = -1, quant_ms = -1, best_ms = -1;
  double tops = 0, gbs = 0, copy_frac = 0, vs_bf16 = 0, gemm_vs_bf16 = 0, err = -1;
  // M = 1, the decode kernel and cuBLAS bf16 (M 2..kChainMaxM: every perry op's GEMM and cuBLAS
  // bf16): the median time a call of kChainCalls back to back (each on the next rotated weight
  // copy, no event between them), as a decode step runs its layers; its bandwidth and that time
  // against cuBLAS bf16's chained time.
  double chain_ms = -1, chain_gbs = 0, chain_copy_frac = 0, chain_vs_bf16 = 0;
};

// Calls a chained timing runs back to back (Row::chain_ms), and the most rows it is run at (M = 1
// and 2..kChainMaxM: batched decode).
constexpr int kChainCalls = 8;
constexpr int kChainMaxM = 64;

int n_groups(int group, int K) { return group == 0 ? 1 : (K + group - 1) / group; }

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

const char* kind_name(Kind k) { return k == Kind::Perry ? "perry" : k == Kind::Peer ? "peer" : "quantize"; }

// Copies of one weight format (bytes + the scale layouts its ops need), used in rotation.
struct WeightPool {
  int copies = 0, next = 0;
  size_t row_bytes = 0, copy_bytes = 0;  // copy_bytes: weights + scales of one copy
  std::vector<DeviceBuffer> data;
  std::map<int, std::vector<DeviceBuffer>> scales;  // scale group (0 = per channel) → copies of [N, G]
  // int4 with groups of 128: the scales are two-level (w4a8-g128's form), these their factors
  std::vector<DeviceBuffer> channel, multipliers;  // copies of fp32 [N], int8 [N, G]
  // int4 per channel (w4a8) in the two-level form: multipliers of 1 [N, K/128], one per copy (the
  // channel scales are the per-channel scales themselves; int4_two_level_factors)
  std::vector<DeviceBuffer> unit_multipliers;
  int take() {
    const int c = next;
    next = (next + 1) % copies;
    return c;
  }
};

class Events {  // CUDA events, destroyed on every path
 public:
  explicit Events(size_t n) : ev_(n, nullptr) {
    for (auto& e : ev_) PERRY_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (auto e : ev_)
      if (e) cudaEventDestroy(e);
  }
  cudaEvent_t operator[](size_t i) const { return ev_[i]; }
  double ms(size_t a, size_t b) const {
    float t = 0;
    PERRY_CUDA_CHECK(cudaEventElapsedTime(&t, ev_[a], ev_[b]));
    return t;
  }

 private:
  std::vector<cudaEvent_t> ev_;
};

template <typename T>
std::vector<T> download(const void* src, size_t count) {
  std::vector<T> h(count);
  PERRY_CUDA_CHECK(cudaMemcpy(h.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

class Bench {
 public:
  explicit Bench(const CudaBenchOpOptions& o) : o_(o), pool_(o.device) {}
  ~Bench();
  int run();

 private:
  void setup();
  void measure_copy_bandwidth();
  void run_shape(int N, int K, const std::vector<int>& Ms);
  void run_case(int M);
  OpArgs args(Op op, int copy, int M) const;
  void fill_two_level_scales(WeightPool& p, int N, int K, DeviceBuffer& scales);
  struct HostActs {  // sampled activation rows on the host
    std::vector<int> ms;
    std::vector<std::vector<float>> x;
    std::vector<std::vector<int8_t>> xq;
    std::vector<std::vector<uint8_t>> x8, xf8;
    std::vector<float> sa, sf8;
  };
  HostActs host_acts(int M);
  Verdict check_op(Op op, int M, const HostActs& h, const OpContext& ctx);
  void write(const std::string& aborted) const;
  void print_row(const Row& r) const;

  const CudaBenchOpOptions& o_;
  DevicePool pool_;
  cudaDeviceProp prop_{};
  std::string device_line_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer blas_ws_, lt_ws_;
  std::vector<Op> ops_;
  std::vector<std::string> notes_;
  std::vector<StartupCheck> startup_;
  std::set<std::string> startup_failed_;
  std::vector<Row> rows_;
  double copy_gbs_ = 0;
  int warmup_ = 3, reps_ = 30;
  int64_t spin_ns_ = 2'000'000;
  int host_bound_rounds_ = 0;
  std::mt19937_64 rng_{20260512};
  // The current shape.
  int N_ = 0, K_ = 0;
  std::map<WFmt, WeightPool> pools_;
  DeviceBuffer x_, x32_, xq_, sa_, x8_, xf8_, sf8_, y_, scratch_, splitk_, flags_;
  std::vector<int> ns_;                                          // sampled output columns
  std::map<WFmt, std::vector<std::vector<uint8_t>>> host_w_;     // copy 0, rows ns_
  std::map<std::pair<WFmt, int>, std::vector<std::vector<float>>> host_s_;
};

Bench::~Bench() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (lt_) cublasLtDestroy(lt_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void Bench::setup() {
  device_line_ = describe_device(o_.device);
  PERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop_, o_.device));
  PERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  check_cublas_status(cublasCreate(&blas_), "cublasCreate");
  check_cublas_status(cublasSetStream(blas_, stream_), "cublasSetStream");
  blas_ws_ = DeviceBuffer(pool_, 32 << 20, "cuBLAS workspace");  // as the CUDA backend sets it up
  check_cublas_status(cublasSetWorkspace(blas_, blas_ws_.get(), blas_ws_.bytes()), "cublasSetWorkspace");
  check_cublas_status(cublasLtCreate(&lt_), "cublasLtCreate");
  lt_ws_ = DeviceBuffer(pool_, 32 << 20, "cuBLASLt workspace");

  // --no-wgmma: perry's rows as the model runs with PERRY_NO_WGMMA=1 (mma.sync where it would take
  // the sm_90 wgmma GEMMs): the way around a wgmma kernel that fails or hangs. linear_path reads the
  // variable once, so it must be set before the first call that asks (none has in `perry
  // bench-op`; a test process may have asked already: then this refuses to run).
  if (!o_.wgmma) {
    setenv("PERRY_NO_WGMMA", "1", 1);
    PERRY_CHECK(linear_path(pq::QuantMode::W8A8, 4096, 4096) != LinearPath::Wgmma,
                "bench-op --no-wgmma: the wgmma choice was made before PERRY_NO_WGMMA could be set; set it in "
                "the environment instead");
  }
  // The ops: perry bf16 + the chosen quantized modes (default all), then the peers.
  std::vector<std::string> modes = o_.common.modes;
  if (modes.empty()) modes = {"w8a16", "w4a16", "w8a8", "w8a8-g128", "w8a8-g64", "w4a8", "w4a8-g128", "w8a8-fp8"};
  ops_ = {Op::Quantize, Op::Bf16};
  for (const auto& m : modes) {
    const auto q = pq::parse_quant_mode(m);
    if (q == pq::QuantMode::BF16) continue;  // always measured (the baseline)
    PERRY_CHECK(q && pq::is_quantized(*q), "bench-op: unknown quantized mode '{}' (known: {})", m,
                pq::quant_mode_names());
    const Op op = perry_op(*q);
    if (op == Op::W8A8Fp8 && !gemm_w8a8_wgmma_supported()) {
      // CudaLinear refuses the mode there too (its only kernel is wgmma e4m3): nothing to time.
      const std::string note = "w8a8-fp8 not timed: its kernel (gemm_fp8_wgmma) needs sm_90";
      if (std::find(notes_.begin(), notes_.end(), note) == notes_.end()) notes_.push_back(note);
      continue;
    }
    if (std::find(ops_.begin(), ops_.end(), op) == ops_.end()) ops_.push_back(op);
    // Its rows appear only where w8a8 takes the wgmma GEMM (has_row): sm_90, M past gemm_small_m,
    // wgmma on.
    if (op == Op::W8A8 && std::find(ops_.begin(), ops_.end(), Op::W8A8Mma) == ops_.end()) {
      ops_.push_back(Op::W8A8Mma);
      if (linear_path(pq::QuantMode::W8A8, 4096, 4096) != LinearPath::Wgmma)
        notes_.push_back(fmt::format("no w8a8-mma rows: w8a8 runs {} at every M > {} here ({})",
                                     gemm_w8a8_kernel_name(), CudaLinear::kSmallMA8MaxM,
                                     gemm_w8a8_wgmma_supported() ? "PERRY_NO_WGMMA / --no-wgmma" : "no sm_90"));
    }
  }
  // Its activation quantization alone, next to the int8 one (the `quant ms` of the fp8 row).
  if (std::find(ops_.begin(), ops_.end(), Op::W8A8Fp8) != ops_.end()) ops_.insert(ops_.begin() + 1, Op::QuantizeFp8);
  ops_.insert(ops_.end(), {Op::CublasBf16, Op::LtI8I32, Op::LtI8I8});
  if (prop_.major * 10 + prop_.minor >= 89) ops_.push_back(Op::LtE4M3);
  else notes_.push_back("cublaslt-e4m3-bf16 not timed: fp8 tensor cores need sm_89 or newer");
  if (o_.common.repeats > 0) reps_ = o_.common.repeats;
  else if (o_.common.quick) reps_ = 10;
}

void Bench::measure_copy_bandwidth() {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer a(pool_, bytes, "copy-bandwidth source"), b(pool_, bytes, "copy-bandwidth destination");
  PERRY_CUDA_CHECK(cudaMemsetAsync(a.get(), 0x5a, bytes, stream_));
  Events ev(2 * 7);
  for (int r = 0; r < 2; ++r) PERRY_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
  for (int r = 0; r < 7; ++r) {
    PERRY_CUDA_CHECK(cudaEventRecord(ev[2 * r], stream_));
    PERRY_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
    PERRY_CUDA_CHECK(cudaEventRecord(ev[2 * r + 1], stream_));
  }
  PERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) t.push_back(ev.ms(2 * r, 2 * r + 1));
  copy_gbs_ = 2.0 * double(bytes) / (median(t) * 1e-3) * 1e-9;
  fmt::print("device copy bandwidth (cudaMemcpy D2D 1 GiB, read+write): {:.0f} GB/s\n", copy_gbs_);
}

OpArgs Bench::args(Op op, int copy, int M) const {
  OpArgs a;
  a.x = x_.get<uint16_t>();
  a.x32 = x32_.get<float>();
  a.xq = xq_.get<int8_t>();
  a.sa = sa_.get<float>();
  a.x8 = x8_.get<uint8_t>();
  a.xf8 = xf8_.get<uint8_t>();
  a.sf8 = sf8_.get<float>();
  a.y = y_.get();
  a.M = M;
  a.N = N_;
  a.K = K_;
  const WFmt f = op_info(op).fmt;
  if (f != WFmt::None) {
    const WeightPool& p = pools_.at(f);
    a.w = p.data[size_t(copy)].get();
    if (has_weight_scales(op)) a.scales = p.scales.at(scale_group(op))[size_t(copy)].get<float>();
    if (op == Op::W4A8G128 && !p.channel.empty()) {
      a.channel_scales = p.channel[size_t(copy)].get<float>();
      a.multipliers = p.multipliers[size_t(copy)].get<int8_t>();
    }
    if (op == Op::W4A8 && !p.unit_multipliers.empty()) {
      a.channel_scales = a.scales;
      a.multipliers = p.unit_multipliers[size_t(copy)].get<int8_t>();
    }
  }
  return a;
}

// Scales of the form w4a8-g128's quantizer writes (quant/two_level_scales.h): the channel scale of a
// random row amax times random multipliers 1..18, exact in fp32; the factors go to the pool too,
// for the w4a8-g128 prefill path (run_expanded_int4_two_level).
void Bench::fill_two_level_scales(WeightPool& p, int N, int K, DeviceBuffer& scales) {
  const int G = K / 128;
  std::uniform_real_distribution<float> damax(6e-3f, 0.126f);  // channel scales 5e-5 .. 1e-3
  std::uniform_int_distribution<int> dm(1, pq::kTwoLevelMaxMultiplier);
  std::vector<float> ch(static_cast<size_t>(N)), s(size_t(N) * size_t(G));
  std::vector<int8_t> mul(s.size());
  for (int n = 0; n < N; ++n) {
    const float c = pq::two_level_channel_scale(damax(rng_));
    ch[size_t(n)] = c;
    for (int g = 0; g < G; ++g) {
      const int m = dm(rng_);
      mul[size_t(n) * G + g] = int8_t(m);
      s[size_t(n) * G + g] = c * float(m);
    }
  }
  copy_to_device(scales.get(), s.data(), s.size() * 4);
  p.channel.emplace_back(pool_, ch.size() * 4, "bench-op channel scales");
  copy_to_device(p.channel.back().get(), ch.data(), ch.size() * 4);
  p.multipliers.emplace_back(pool_, mul.size(), "bench-op group scale multipliers");
  copy_to_device(p.multipliers.back().get(), mul.data(), mul.size());
}

void Bench::run_shape(int N, int K, const std::vector<int>& Ms) {
  N_ = N;
  K_ = K;
  pools_.clear();
  host_w_.clear();
  host_s_.clear();
  const int Mmax = *std::max_element(Ms.begin(), Ms.end());
  // Weight pools: which formats and scale layouts the ops need.
  std::map<WFmt, std::set<int>> need;
  for (Op op : ops_) {
    const WFmt f = op_info(op).fmt;
    if (f == WFmt::None) continue;
    need[f];
    if (has_weight_scales(op)) need[f].insert(scale_group(op));
  }
  const size_t l2 = size_t(std::max(prop_.l2CacheSize, 1 << 20));
  std::string rotation;
  for (const auto& [f, groups] : need) {
    WeightPool& p = pools_[f];
    p.row_bytes = weight_row_bytes(f, K);
    p.copy_bytes = p.row_bytes * size_t(N);
    for (int g : groups) p.copy_bytes += size_t(N) * size_t(n_groups(g, K)) * 4;
    // Between two uses of a copy the other copies are read: more than 4× L2 in all.
    p.copies = int(std::clamp<size_t>((4 * l2 + p.copy_bytes - 1) / p.copy_bytes + 1, 2, 64));
    for (int c = 0; c < p.copies; ++c) {
      p.data.emplace_back(pool_, p.row_bytes * size_t(N), "bench-op weight copies");
      void* d = p.data.back().get();
      const size_t n = p.row_bytes * size_t(N);
      switch (f) {
        case WFmt::BF16: fill_random_bf16(static_cast<uint16_t*>(d), n / 2, rng_(), 0.05f, stream_); break;
        case WFmt::I8: fill_random_i8(static_cast<int8_t*>(d), n, rng_(), stream_); break;
        case WFmt::I4: fill_random_int4(static_cast<uint8_t*>(d), n, rng_(), stream_); break;
        case WFmt::E4M3: fill_random_e4m3(static_cast<uint8_t*>(d), n, rng_(), 1.0f, stream_); break;
        case WFmt::None: break;
      }
      for (int g : groups) {
        const size_t cnt = size_t(N) * size_t(n_groups(g, K));
        p.scales[g].emplace_back(pool_, cnt * 4, "bench-op weight scales");
        if (f == WFmt::I4 && g == 128 && K % 128 == 0) fill_two_level_scales(p, N, K, p.scales[g].back());
        else fill_random_f32(p.scales[g].back().get<float>(), cnt, rng_(), 1e-3f, 2e-2f, stream_);
        if (f == WFmt::I4 && g == 0 && K % 128 == 0) {
          p.unit_multipliers.emplace_back(pool_, size_t(N) * size_t(K / 128), "bench-op unit multipliers (w4a8)");
          PERRY_CUDA_CHECK(cudaMemsetAsync(p.unit_multipliers.back().get(), 1, p.unit_multipliers.back().bytes(), stream_));
        }
      }
    }
    rotation += fmt::format("{}{}×{:.0f} MB", rotation.empty() ? "" : ", ", p.copies, double(p.copy_bytes) * 1e-6);
  }
  x_ = DeviceBuffer(pool_, size_t(Mmax) * K * 2, "bench-op activations (bf16)");
  xq_ = DeviceBuffer(pool_, size_t(Mmax) * K, "bench-op activations (int8)");
  sa_ = DeviceBuffer(pool_, size_t(Mmax) * 4, "bench-op activation scales");
  x8_ = DeviceBuffer(pool_, size_t(Mmax) * K, "bench-op activations (e4m3, the fp8 peer)");
  if (std::find(ops_.begin(), ops_.end(), Op::QuantizeFp8) != ops_.end()) {
    xf8_ = DeviceBuffer(pool_, size_t(Mmax) * K, "bench-op activations (e4m3, w8a8-fp8)");
    sf8_ = DeviceBuffer(pool_, size_t(Mmax) * 4, "bench-op activation scales (w8a8-fp8)");
  }
  y_ = DeviceBuffer(pool_, size_t(Mmax) * N * 4, "bench-op outputs");
  scratch_ = DeviceBuffer(pool_, size_t(N) * K * 2, "bench-op dequantized weight scratch");
  size_t splitk = 0;  // what CudaLinear's split-K uses at the Ms timed here
  for (Op op : ops_)
    for (int m : Ms)
      if (op_info(op).kind == Kind::Perry)
        splitk = std::max(splitk, linear_splitk_bytes(op_info(op).mode, op_path(op, m, int(K), int(N)), m, int(N), int(K)));
  splitk_ = DeviceBuffer(pool_, splitk, "bench-op split-K partial sums");
  flags_ = DeviceBuffer(pool_, size_t(kGemmW8A8TileFlags) * 4, "bench-op split-K tile flags");  // (zeroed: as CudaLinear)
  PERRY_CUDA_CHECK(cudaMemsetAsync(flags_.get(), 0, flags_.bytes(), stream_));
  fill_random_bf16(x_.get<uint16_t>(), size_t(Mmax) * K, rng_(), 1.0f, stream_);
  fill_random_e4m3(x8_.get<uint8_t>(), size_t(Mmax) * K, rng_(), 1.0f, stream_);
  PERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  {  // row 0 as fp32, the decode kernel's input (the same values: bf16 widens exactly)
    const std::vector<uint16_t> xb = download<uint16_t>(x_.get<uint16_t>(), size_t(K));
    std::vector<float> xf(xb.size());
    for (size_t k = 0; k < xb.size(); ++k) xf[k] = bf16_to_f32(xb[k]);
    x32_ = DeviceBuffer(pool_, xf.size() * 4, "bench-op activation row (fp32)");
    PERRY_CUDA_CHECK(cudaMemcpy(x32_.get<float>(), xf.data(), xf.size() * 4, cudaMemcpyHostToDevice));
  }
  fmt::print("\n== N={} K={}: weight copies in rotation (count×size): {} ==\n", N, K, rotation);

  // Host copies of the sampled weight rows (copy 0) for the output checks.
  std::uniform_int_distribution<int> dn(0, N - 1);
  std::set<int> cols = {0, N - 1};
  while (int(cols.size()) < std::min(N, 8)) cols.insert(dn(rng_));
  ns_.assign(cols.begin(), cols.end());
  for (auto& [f, p] : pools_) {
    for (int n : ns_) host_w_[f].push_back(download<uint8_t>(p.data[0].get<uint8_t>() + size_t(n) * p.row_bytes, p.row_bytes));
    for (auto& [g, bufs] : p.scales) {
      const size_t G = size_t(n_groups(g, K));
      for (int n : ns_) host_s_[{f, g}].push_back(download<float>(bufs[0].get<float>() + size_t(n) * G, G));
    }
  }
  for (int M : Ms) run_case(M);
  pools_.clear();
  for (DeviceBuffer* b : {&x_, &xq_, &sa_, &x8_, &xf8_, &sf8_, &y_, &scratch_, &splitk_, &flags_}) b->reset();
}

// Sampled activation rows (first, last, random) on the host: the bf16 values, their per-token
// quantizations by the CPU rules (int8, e4m3), the fp8 peer's e4m3 bytes.
Bench::HostActs Bench::host_acts(int M) {
  const int K = K_;
  HostActs h;
  std::set<int> rows = {0, M - 1};
  std::uniform_int_distribution<int> dm(0, M - 1);
  while (int(rows.size()) < std::min(M, 8)) rows.insert(dm(rng_));
  h.ms.assign(rows.begin(), rows.end());
  for (int m : h.ms) {
    const auto xb = download<uint16_t>(x_.get<uint16_t>() + size_t(m) * K, size_t(K));
    h.x.emplace_back(size_t(K));
    for (int k = 0; k < K; ++k) h.x.back()[size_t(k)] = bf16_to_f32(xb[size_t(k)]);
    h.xq.emplace_back(size_t(K));
    h.sa.push_back(pq::quantize_row_ref(h.x.back().data(), K, h.xq.back().data()));
    h.x8.push_back(download<uint8_t>(x8_.get<uint8_t>() + size_t(m) * K, size_t(K)));
    h.xf8.emplace_back(size_t(K));
    h.sf8.push_back(pq::quantize_row_fp8_ref(h.x.back().data(), K, h.xf8.back().data()));
  }
  return h;
}

Verdict Bench::check_op(Op op, int M, const HostActs& h, const OpContext& ctx) {
  const int K = K_, N = N_;
  const std::vector<int>& ms = h.ms;
  // NaN: an unwritten output fails; 0 for the decode kernel, which adds its product to y.
  PERRY_CUDA_CHECK(cudaMemsetAsync(y_.get(), decode_kernel_row(op, M, K) ? 0 : 0xff, size_t(M) * N * 4, stream_));
  run_op(op, args(op, 0, M), true, ctx);
  sync_or_hang(stream_, 20, fmt::format("the output check of {} at N={} K={} M={}", op_info(op).name, N, K, M));
  if (op == Op::Quantize || op == Op::QuantizeFp8) {  // bytes and scales exactly as the CPU rule gives them
    const bool fp8 = op == Op::QuantizeFp8;
    const auto* dq = fp8 ? xf8_.get<uint8_t>() : reinterpret_cast<const uint8_t*>(xq_.get<int8_t>());
    const float* ds = fp8 ? sf8_.get<float>() : sa_.get<float>();
    size_t bad = 0;
    for (size_t i = 0; i < ms.size(); ++i) {
      const auto q = download<uint8_t>(dq + size_t(ms[i]) * K, size_t(K));
      const auto s = download<float>(ds + ms[i], 1);
      const float want_s = fp8 ? h.sf8[i] : h.sa[i];
      const auto* want_q = fp8 ? h.xf8[i].data() : reinterpret_cast<const uint8_t*>(h.xq[i].data());
      bad += size_t(std::memcmp(&s[0], &want_s, 4) != 0);
      for (int k = 0; k < K; ++k) bad += size_t(q[size_t(k)] != want_q[k]);
    }
    Verdict v;
    v.ok = bad == 0;
    v.err = double(bad);
    v.what = fmt::format("{}{} of {} sampled bytes/scales differ from quant::{}", bad ? "FAIL: " : "", bad,
                         ms.size() * size_t(K + 1), fp8 ? "quantize_row_fp8_ref" : "quantize_row_ref");
    return v;
  }
  const DType out = output_dtype(op, M, K, N, ctx.float_out);
  const size_t es = dtype_bits(out) / 8;
  const float alpha = ctx.lt_i8_i8 ? ctx.lt_i8_i8->alpha() : 1.0f;
  std::vector<double> got, ref;
  for (size_t i = 0; i < ms.size(); ++i) {
    const auto yrow = download<uint8_t>(y_.get<uint8_t>() + size_t(ms[i]) * N * es, size_t(N) * es);
    const HostAct act{h.x[i].data(), h.xq[i].data(), h.sa[i], h.x8[i].data(), h.xf8[i].data(), h.sf8[i]};
    for (size_t j = 0; j < ns_.size(); ++j) {
      const WFmt f = op_info(op).fmt;
      HostRow w{host_w_.at(f)[j].data(), nullptr};
      if (has_weight_scales(op)) w.scales = host_s_.at({f, scale_group(op)})[j].data();
      got.push_back(output_value(out, yrow.data(), ns_[j]));
      ref.push_back(reference(op, w, act, K, alpha));
    }
  }
  return judge(op, got, ref);
}

void Bench::run_case(int M) {
  const int N = N_, K = K_;
  // cuBLASLt: descriptors and the best heuristic for this shape.
  const float i8_alpha = float(40.0 / (std::sqrt(double(K)) * 127.0 * 128.0 / 3.0));  // int8 outputs of σ ≈ 40
  // What runs at this M; an op that cannot run (no cuBLASLt algorithm, an error) becomes a note row.
  std::map<Op, std::string> unavailable;
  auto make_lt = [&](Op op, LtGemmKind kind, float alpha) -> std::unique_ptr<LtGemm> {
    if (std::find(ops_.begin(), ops_.end(), op) == ops_.end()) return nullptr;
    try {
      auto g = std::make_unique<LtGemm>(lt_, kind, M, N, K, lt_ws_.bytes(), alpha);
      if (g->available()) return g;
      unavailable[op] = g->note();
    } catch (const Error& e) {
      unavailable[op] = e.what();
    }
    return nullptr;
  };
  const std::unique_ptr<LtGemm> lt32 = make_lt(Op::LtI8I32, LtGemmKind::I8_I32, 1.0f),
                                lt8 = make_lt(Op::LtI8I8, LtGemmKind::I8_I8, i8_alpha),
                                lte = make_lt(Op::LtE4M3, LtGemmKind::E4M3_BF16, 1.0f);
  const OpContext ctx{stream_,   blas_,     scratch_.get<uint16_t>(), lt_ws_.get(), lt32.get(),
                      lt8.get(), lte.get(), splitk_.get<int32_t>(),   splitk_.bytes(),
                      flags_.get<uint32_t>(), o_.float_out};
  std::vector<Op> ops;
  for (Op op : ops_) {
    if (!has_row(op, M, K)) continue;
    if (unavailable.count(op)) continue;
    try {  // probe once (this also writes xq / sa, which the int8 peers read)
      run_op(op, args(op, 0, M), true, ctx);
      sync_or_hang(stream_, 20, fmt::format("the first call of {} at N={} K={} M={}", op_info(op).name, N, K, M));
      ops.push_back(op);
    } catch (const HangError&) {
      throw;
    } catch (const Error& e) {
      const cudaError_t sticky = cudaDeviceSynchronize();
      if (sticky != cudaSuccess)
        fail("the CUDA context is broken after {} at N={} K={} M={}: {}; rerun without it (--modes, --no-wgmma)",
             op_info(op).name, N, K, M, cudaGetErrorString(sticky));
      cudaGetLastError();
      unavailable[op] = e.what();
    }
  }

  // Timed items: every op; the W*A8 ops and w8a8-fp8 also without their quantization (the GEMM alone).
  struct Item {
    Op op;
    bool quantize;
    std::vector<double> ms;
  };
  std::vector<Item> items;
  for (Op op : ops) {
    items.push_back({op, true, {}});
    // (M = 1: the decode kernel quantizes its row inside, no separate step to leave out.)
    if (quantizes_activations(op) && !decode_kernel_row(op, M, K)) items.push_back({op, false, {}});
  }
  Events ev(2 * items.size());
  for (int r = 0; r < warmup_ + reps_; ++r) {
    spin_stream(spin_ns_, stream_);
    const auto t0 = Clock::now();
    for (size_t i = 0; i < items.size(); ++i) {
      const Op op = items[i].op;
      const WFmt f = op_info(op).fmt;
      const int copy = f == WFmt::None ? 0 : pools_.at(f).take();
      PERRY_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream_));
      run_op(op, args(op, copy, M), items[i].quantize, ctx);
      PERRY_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream_));
    }
    const double host_ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    sync_or_hang(stream_, 60, fmt::format("a timing round at N={} K={} M={}", N, K, M));
    // The GPU may have waited for the host in this round when queueing took longer than the spin.
    if (r >= warmup_ && host_ns > 0.9 * double(spin_ns_)) ++host_bound_rounds_;
    spin_ns_ = std::clamp<int64_t>(int64_t(2 * host_ns), 2'000'000, 200'000'000);
    if (r >= warmup_)
      for (size_t i = 0; i < items.size(); ++i) items[i].ms.push_back(ev.ms(2 * i, 2 * i + 1));
  }

  // M = 1: the GEMVs also back to back. Isolated, a call pays its launch, its prologue (the decode
  // kernel reads and quantizes the whole input row before its first product) and its ramp and
  // tail; in a decode step each GEMV's start overlaps the one before it (programmatic dependent
  // launch), which a chain of calls on rotated weights measures: what the weights stream at.
  // 2..kChainMaxM rows (batched decode): the same for every perry op, on the GEMM alone — in a
  // decode step the kernel before (RMSNorm, SwiGLU) writes the activation quantized, and each
  // layer's weight stream follows the previous one. Isolated, a 15-60 us call of one layer also
  // pays a ramp and tail that a plain read of its 20-60 MB shows too (lab_cuda_weight_stream).
  std::map<Op, std::vector<double>> chain;
  std::vector<Op> cops;
  if (M <= kChainMaxM)
    for (Op op : ops)
      if (op == Op::CublasBf16 ||
          (op_info(op).kind == Kind::Perry && (M == 1 ? decode_kernel_row(op, M, K) : has_row(op, M, K))))
        cops.push_back(op);
  if (!cops.empty()) {
    Events cev(2 * cops.size());
    for (int r = 0; r < warmup_ + reps_; ++r) {
      spin_stream(spin_ns_, stream_);
      for (size_t i = 0; i < cops.size(); ++i) {
        const Op op = cops[i];
        PERRY_CUDA_CHECK(cudaEventRecord(cev[2 * i], stream_));
        for (int c = 0; c < kChainCalls; ++c)
          run_op(op, args(op, pools_.at(op_info(op).fmt).take(), M), M == 1, ctx);
        PERRY_CUDA_CHECK(cudaEventRecord(cev[2 * i + 1], stream_));
      }
      sync_or_hang(stream_, 60, fmt::format("a chained timing round at N={} K={} M={}", N, K, M));
      if (r >= warmup_)
        for (size_t i = 0; i < cops.size(); ++i) chain[cops[i]].push_back(cev.ms(2 * i, 2 * i + 1) / kChainCalls);
    }
  }
  const double chain_bf16 = chain.count(Op::CublasBf16) ? median(chain.at(Op::CublasBf16)) : -1.0;

  // Rows: medians, ratios, checks.
  std::map<std::pair<Op, bool>, const Item*> by;
  for (const Item& it : items) by[{it.op, it.quantize}] = &it;
  auto med = [&](Op op, bool q) { return by.count({op, q}) ? median(by.at({op, q})->ms) : -1.0; };
  const double t_bf16 = med(Op::CublasBf16, true);
  const double flops = 2.0 * M * double(N) * K;
  const HostActs acts = host_acts(M);
  fmt::print("M={:<5} {:<20} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7} {:>8}  check / kernel\n", M, "variant", "ms",
             "gemm ms", "TOPS", "GB/s", "x bf16", "gemm x", "best ms");
  for (Op op : ops_) {
    if (!has_row(op, M, K)) continue;
    const OpInfo& in = op_info(op);
    Row r;
    r.N = N;
    r.K = K;
    r.M = M;
    r.variant = in.name;
    r.kind = kind_name(in.kind);
    if (unavailable.count(op)) {
      r.kernel = "n/a";
      r.check = "not run: " + unavailable[op];
      r.ok = in.kind != Kind::Perry;  // a perry mode that cannot run is a failure; a missing peer is not
      rows_.push_back(r);
      print_row(r);
      continue;
    }
    r.kernel = kernel_name(op, M, K, ctx, N);
    r.ms = med(op, true);
    r.best_ms = *std::min_element(by.at({op, true})->ms.begin(), by.at({op, true})->ms.end());
    const bool quantizes = quantizes_activations(op) && !decode_kernel_row(op, M, K);
    r.gemm_ms = quantizes ? med(op, false) : in.kind == Kind::Quantize ? -1 : r.ms;
    r.quant_ms = quantizes ? med(quantize_op(op), true) : in.kind == Kind::Quantize ? r.ms : -1;
    double bytes = 0;
    if (in.fmt != WFmt::None) {
      bytes = double(pools_.at(in.fmt).row_bytes) * N;
      if (has_weight_scales(op)) bytes += double(N) * n_groups(scale_group(op), K) * 4;
      r.tops = flops / (r.ms * 1e-3) * 1e-12;
    } else {
      bytes = 3.0 * M * K + 4.0 * M;  // quantize: read bf16, write int8 + scales
    }
    r.gbs = bytes / (r.ms * 1e-3) * 1e-9;
    r.copy_frac = copy_gbs_ > 0 ? r.gbs / copy_gbs_ : 0;
    r.vs_bf16 = t_bf16 > 0 ? t_bf16 / r.ms : 0;
    // The GEMM alone against cuBLAS bf16: what a model layer pays where the kernel producing the
    // activation (RMSNorm, SwiGLU) already wrote it quantized — perry's CudaLinear path.
    r.gemm_vs_bf16 = t_bf16 > 0 && r.gemm_ms > 0 ? t_bf16 / r.gemm_ms : 0;
    if (chain.count(op)) {
      r.chain_ms = median(chain.at(op));
      r.chain_gbs = bytes / (r.chain_ms * 1e-3) * 1e-9;
      r.chain_copy_frac = copy_gbs_ > 0 ? r.chain_gbs / copy_gbs_ : 0;
      r.chain_vs_bf16 = chain_bf16 > 0 ? chain_bf16 / r.chain_ms : 0;
    }
    const Verdict v = check_op(op, M, acts, ctx);
    r.ok = v.ok;
    r.err = v.err;
    r.check = v.what;
    if (startup_failed_.count(r.variant)) {
      r.ok = false;
      r.check = "FAIL (startup check); " + r.check;
    }
    rows_.push_back(r);
    print_row(r);
  }
  std::fflush(stdout);
}

void Bench::print_row(const Row& r) const {
  if (r.ms < 0) {
    fmt::print("        {:<20} {}\n", r.variant, r.check);
    return;
  }
  fmt::print("        {:<20} {:>9.4f} {:>9.4f} {:>8.1f} {:>8.0f} {:>7.2f} {:>7.2f} {:>8.4f}  {} | {}\n", r.variant,
             r.ms, r.gemm_ms, r.tops, r.gbs, r.vs_bf16, r.gemm_vs_bf16, r.best_ms, r.ok ? "ok" : r.check, r.kernel);
  if (r.chain_ms > 0)
    fmt::print("          {} back to back: {:.4f} ms a call, {:.0f} GB/s ({:.0f}% of copy), {:.2f}x cuBLAS bf16\n",
               kChainCalls, r.chain_ms, r.chain_gbs, 100 * r.chain_copy_frac, r.chain_vs_bf16);
}

void Bench::write(const std::string& aborted) const {
  if (o_.common.out_prefix.empty()) return;
  int failures = 0;
  for (const auto& r : rows_) failures += !r.ok;
  for (const auto& c : startup_) failures += !c.verdict.ok;
  const std::string method =
      fmt::format("CUDA events around each call, median of {} rounds after {} warm-up rounds; ops interleaved "
                  "within a round behind a spin kernel (no host launch latency in a timing); weights rotated over "
                  "copies > 4x L2 ({} MiB) per format, so never L2-resident; fresh random data; perry rows run "
                  "the kernels CudaLinear picks at each M (linear_path), writing {} (cuBLAS bf16: bf16; "
                  "gemm_small_m, gemv_quant and the decode kernel: fp32), w8a8-mma the mma.sync GEMM where w8a8 "
                  "picks wgmma, and at M = 1 the decode step's kernel (gemv_decode as o_proj runs it: fp32 row "
                  "in, its quantization inside, the product added to y); W*A8 rows include "
                  "quantize_per_token of the bf16 activation, w8a8-fp8 quantize_per_token_fp8 (gemm ms: without "
                  "it); at M = 1 the decode kernel, at 2..{} rows every perry op's GEMM (without the activation "
                  "quantization), and cuBLAS bf16 also {} calls back to back on rotated weights (table 'Back to "
                  "back'); every op's output checked on 8x8 "
                  "samples against a host reference (float rows: max |err| / rms <= {:.0e}; int rows exact / +-1)",
                  reps_, warmup_, prop_.l2CacheSize >> 20, o_.float_out == DType::BF16 ? "bf16" : "fp32",
                  kChainMaxM, kChainCalls, kErrLimit);
  nlohmann::json j;
  j["device"] = device_line_;
  j["copy_bandwidth_gbs"] = copy_gbs_;
  j["method"] = method;
  j["notes"] = notes_;
  j["host_bound_rounds"] = host_bound_rounds_;
  j["chain_calls"] = kChainCalls;
  j["failures"] = failures;
  if (!aborted.empty()) j["aborted"] = aborted;
  j["startup_checks"] = nlohmann::json::array();
  for (const auto& c : startup_)
    j["startup_checks"].push_back({{"variant", c.op}, {"M", c.M}, {"N", c.N}, {"ok", c.verdict.ok}, {"err", c.verdict.err},
                                   {"err_vs_unquantized", c.err_float}, {"check", c.verdict.what},
                                   {"kernel", c.kernel}});
  j["results"] = nlohmann::json::array();
  for (const auto& r : rows_)
    j["results"].push_back({{"N", r.N}, {"K", r.K}, {"M", r.M}, {"variant", r.variant}, {"kind", r.kind},
                            {"kernel", r.kernel}, {"ms", r.ms}, {"gemm_ms", r.gemm_ms}, {"quant_ms", r.quant_ms},
                            {"best_ms", r.best_ms}, {"tops", r.tops}, {"gbs", r.gbs}, {"copy_frac", r.copy_frac},
                            {"vs_cublas_bf16", r.vs_bf16}, {"gemm_vs_cublas_bf16", r.gemm_vs_bf16}, {"ok", r.ok}, {"err", r.err}, {"check", r.check},
                            {"chain_ms", r.chain_ms}, {"chain_gbs", r.chain_gbs}, {"chain_copy_frac", r.chain_copy_frac},
                            {"chain_vs_cublas_bf16", r.chain_vs_bf16}});
  std::ofstream(o_.common.out_prefix + ".json") << j.dump(1) << "\n";

  std::ofstream md(o_.common.out_prefix + ".md");
  md << "# perry bench-op --device cuda\n\n" << device_line_ << "\n\n";
  if (!aborted.empty()) md << "**ABORTED: " << aborted << "** (results up to there below)\n\n";
  md << fmt::format("Device copy bandwidth (cudaMemcpy D2D of 1 GiB, read + write bytes / time): **{:.0f} GB/s**. "
                    "Check failures: **{}**.\n\n",
                    copy_gbs_, failures);
  md << "Method: " << method << ".\n\nColumns: `ms` median per call (W*A8, w8a8-fp8: with the activation "
     << "quantization), `gemm ms` without it, `quant ms` the quantization alone (quantize_per_token; "
     << "w8a8-fp8: quantize_per_token_fp8); TOPS = 2MNK / ms; GB/s (M = 1) = weight + scale "
     << "bytes / ms, `% copy` of the copy bandwidth; `x bf16` = cuBLAS bf16 (bf16 out) time / this time "
     << "(> 1: faster); `gemm x bf16` = the same for `gemm ms` (the GEMM with its scaling epilogue, on "
     << "activations already quantized, as in a model layer where RMSNorm / SwiGLU write them).\n\n";
  for (const auto& n : notes_) md << "- " << n << "\n";
  if (host_bound_rounds_) md << "- " << host_bound_rounds_ << " timed rounds may include host launch latency\n";
  md << "\n| N | K | M | variant | ms | gemm ms | quant ms | TOPS | GB/s | % copy | x bf16 | gemm x bf16 | check | "
        "kernel |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto num = [](double v, const char* f) { return v < 0 ? std::string() : fmt::format(fmt::runtime(f), v); };
  for (const auto& r : rows_) {
    const bool bw = r.M == 1 && r.kind != "quantize";
    md << fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.N, r.K, r.M,
                      r.variant, num(r.ms, "{:.4f}"), r.kind == "perry" || r.kind == "peer" ? num(r.gemm_ms, "{:.4f}") : "",
                      num(r.quant_ms, "{:.4f}"), r.tops > 0 ? fmt::format("{:.1f}", r.tops) : "",
                      bw && r.ms > 0 ? fmt::format("{:.0f}", r.gbs) : "",
                      bw && r.ms > 0 ? fmt::format("{:.0f}%", 100 * r.copy_frac) : "",
                      r.ms > 0 ? fmt::format("{:.2f}", r.vs_bf16) : "",
                      r.gemm_vs_bf16 > 0 ? fmt::format("{:.2f}", r.gemm_vs_bf16) : "", r.ok ? "ok" : r.check, r.kernel);
  }
  if (std::any_of(rows_.begin(), rows_.end(), [](const Row& r) { return r.chain_ms > 0; })) {
    md << fmt::format("\n## Back to back (M = 1 and M <= {})\n\nAt M = 1 the decode kernel and cuBLAS bf16, at 2..{} "
                      "rows every perry op's GEMM (activations already quantized, as the kernel before writes them "
                      "in a decode step) and cuBLAS bf16, run {} calls back to back (each on the next rotated "
                      "weight copy, no event between them), as a decode step runs its layers: a call's share of the "
                      "chain's median time. Isolated calls (the table above) also pay their launch, the decode "
                      "kernel's input prologue and the ramp and tail, which a decode step overlaps with the kernel "
                      "before (programmatic dependent launch). The kernel column names the layer's path; above one row "
                      "the chained W*A8 calls leave out its quantize_per_token.\n\n",
                      kChainMaxM, kChainMaxM, kChainCalls)
       << "| N | K | M | variant | ms a call | GB/s | % copy | x cuBLAS bf16 (back to back) | kernel |\n"
       << "|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : rows_)
      if (r.chain_ms > 0)
        md << fmt::format("| {} | {} | {} | {} | {:.4f} | {:.0f} | {:.0f}% | {:.2f} | {} |\n", r.N, r.K, r.M, r.variant,
                          r.chain_ms, r.chain_gbs, 100 * r.chain_copy_frac, r.chain_vs_bf16, r.kernel);
  }
  md << "\n## Startup check (K=1024, weights from perry's CPU quantizer)\n\n"
     << "| variant | M | N | result | error vs unquantized float (quantization error, info) | kernel |\n"
     << "|---|---|---|---|---|---|\n";
  for (const auto& c : startup_)
    md << fmt::format("| {} | {} | {} | {} | {:.3g} | {} |\n", c.op, c.M, c.N, c.verdict.what, c.err_float,
                      c.kernel);
  fmt::print("wrote {}.md and {}.json\n", o_.common.out_prefix, o_.common.out_prefix);
}

int Bench::run() {
  std::string aborted;
  try {
    setup();
    fmt::print("bench-op --device cuda: {}\n", device_line_);
    std::vector<std::pair<int64_t, int64_t>> shapes = o_.common.shapes;
    if (shapes.empty())
      shapes = o_.common.quick ? std::vector<std::pair<int64_t, int64_t>>{{14336, 4096}}
                               : std::vector<std::pair<int64_t, int64_t>>{
                                     {10240, 2560}, {2560, 10240}, {14336, 4096}, {4096, 14336}, {6144, 4096}};
    std::vector<int> Ms;
    for (int64_t m : o_.common.ms) {
      PERRY_CHECK(m > 0 && m <= 65536, "bench-op: M must be in 1..65536, got {}", m);
      Ms.push_back(int(m));
    }
    if (Ms.empty())
      Ms = o_.common.quick ? std::vector<int>{1, 16, 512, 4096} : std::vector<int>{1, 16, 128, 512, 1024, 2048, 4096, 8192};
    for (auto [N, K] : shapes)
      PERRY_CHECK(N > 0 && K > 0 && N % 8 == 0 && K % 128 == 0 && N <= 65536 && K <= 65536,
                  "bench-op --device cuda: shape {}x{} unsupported: N must be a multiple of 8 and K of 128 (the "
                  "group size), both <= 65536",
                  N, K);
    measure_copy_bandwidth();
    startup_ = startup_checks(ops_, pool_, stream_, blas_);
    for (const auto& c : startup_) {
      if (!c.verdict.ok) {
        startup_failed_.insert(c.op);
        fmt::print("startup check {} M={}: {}\n", c.op, c.M, c.verdict.what);
      }
    }
    const auto passed = std::count_if(startup_.begin(), startup_.end(), [](const StartupCheck& c) { return c.verdict.ok; });
    fmt::print("startup check: {} of {} cases passed\n", passed, startup_.size());
    for (auto [N, K] : shapes) {
      run_shape(int(N), int(K), Ms);
      write("");  // after every shape, so a later abort keeps what was measured
    }
  } catch (const HangError& e) {
    // Cleaning up CUDA would wait for the hung kernel forever: write the results and leave.
    fmt::print(stderr, "bench-op --device cuda aborted: {}\n", e.what());
    write(e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(3);
  } catch (const std::exception& e) {
    aborted = e.what();
    fmt::print(stderr, "bench-op --device cuda aborted: {}\n", aborted);
  }
  write(aborted);
  if (!aborted.empty()) return 2;
  const bool failed = std::any_of(rows_.begin(), rows_.end(), [](const Row& r) { return !r.ok; }) ||
                      !startup_failed_.empty();
  if (failed) fmt::print("bench-op --device cuda: some rows FAILED their output check (see the check column)\n");
  return failed ? 1 : 0;
}

}  // namespace

int run_bench_op_cuda(const CudaBenchOpOptions& o) {
  Bench b(o);
  return b.run();
}

}  // namespace perry::cuda
