// perry bench-op: per-layer latency of every mode vs the float baseline and library peers, all in
// one run, variants alternating, medians after warm-up.
#include "bench/bench_op.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <thread>

#include "core/aligned_buffer.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/float_linear.h"
#include "kernels/cpu/qgemm.h"
#include "quant/quant.h"

namespace perry::bench {

namespace {

using Clock = std::chrono::steady_clock;
namespace pq = perry::quant;

// ---- peers ----------------------------------------------------------------------------------

// oneDNN int8 matmul with the activation quantization a user of it has to do, s8 weights, f32 dst.
// oneDNN 2.6's fast (brgemm) int8 matmul takes only per-N output scales: a per-token [M,1] scale
// as a binary post-op falls back to its reference kernel (measured: ref_int8, ~1000x slower),
// so the peer quantizes the activations per tensor (one dynamic absmax scale, computed with our
// fast quantizer) and passes runtime output scales sa·sw[n]. Same work, slightly coarser numerics.
class OnednnInt8 {
 public:
  OnednnInt8(dnnl::engine& eng, const pq::QuantizedWeight& w) : eng_(eng), w_(w), strm_(eng) {
    PERRY_CHECK(w.mode == pq::QuantMode::W8A8, "OnednnInt8 needs per-channel int8 weights");
  }
  std::string note;
  void run(const float* x, int64_t M, float* y) {
    Case& c = get(M);
    const int64_t K = w_.K, N = w_.N;
    float sa = 0;
    kernels::q::avx512::quantize_rows_u8(x, 1, M * K, c.a.data(), M * K, &sa);  // one scale per tensor
    int8_t* s8 = reinterpret_cast<int8_t*>(c.src.get_data_handle());
    const uint8_t* u8 = c.a.data();
    thread_pool().parallel_for(size_t(M * K), 1 << 16, [&](size_t i0, size_t i1) {
      for (size_t i = i0; i < i1; ++i) s8[i] = int8_t(u8[i] ^ 0x80);
    });
    float* sc = static_cast<float*>(c.scales.get_data_handle());
    for (int64_t n = 0; n < N; ++n) sc[n] = sa * w_.scales[size_t(n)];
    dnnl::memory dst({{M, N}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab}, eng_, y);
    c.prim.execute(strm_, {{DNNL_ARG_SRC, c.src},
                           {DNNL_ARG_WEIGHTS, c.wei},
                           {DNNL_ARG_DST, dst},
                           {DNNL_ARG_ATTR_OUTPUT_SCALES, c.scales}});
    strm_.wait();
  }

 private:
  struct Case {
    dnnl::matmul prim;
    dnnl::memory src, wei, scales;
    AlignedBuffer<uint8_t> a;
  };
  Case& get(int64_t M) {
    auto it = cases_.find(M);
    if (it != cases_.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const int64_t N = w_.N, K = w_.K;
    dnnl::memory::desc src_md({M, K}, dt::s8, tag::ab), wei_md({K, N}, dt::s8, tag::any),
        dst_md({M, N}, dt::f32, tag::ab), sc_md({N}, dt::f32, tag::a);
    dnnl::primitive_attr attr;
    attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), attr, eng_);
    note = pd.impl_info_str();
    Case c;
    c.prim = dnnl::matmul(pd);
    c.src = dnnl::memory(src_md, eng_);
    c.scales = dnnl::memory(sc_md, eng_);
    c.wei = dnnl::memory(pd.weights_desc(), eng_);
    dnnl::memory wsrc({{K, N}, dt::s8, tag::ba}, eng_, const_cast<int8_t*>(w_.qweight.data()));
    dnnl::reorder(wsrc, c.wei).execute(strm_, wsrc, c.wei);
    strm_.wait();
    c.a.resize(size_t(M * K));
    return cases_.emplace(M, std::move(c)).first->second;
  }
  dnnl::engine& eng_;
  const pq::QuantizedWeight& w_;
  dnnl::stream strm_;
  std::map<int64_t, Case> cases_;
};

// oneDNN bf16 or f32 matmul; bf16 includes converting the f32 activations each call.
class OnednnFloat {
 public:
  OnednnFloat(dnnl::engine& eng, const float* w, int64_t N, int64_t K, bool bf16)
      : eng_(eng), w_(w), N_(N), K_(K), bf16_(bf16), strm_(eng) {}
  std::string note;
  void run(const float* x, int64_t M, float* y) {
    Case& c = get(M);
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dnnl::memory xf({{M, K_}, dt::f32, tag::ab}, eng_, const_cast<float*>(x));
    dnnl::memory dst({{M, N_}, dt::f32, tag::ab}, eng_, y);
    dnnl::memory src = xf;
    if (bf16_) {
      c.cvt.execute(strm_, xf, c.src);
      src = c.src;
    }
    c.prim.execute(strm_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, c.wei}, {DNNL_ARG_DST, dst}});
    strm_.wait();
  }

 private:
  struct Case {
    dnnl::matmul prim;
    dnnl::reorder cvt;
    dnnl::memory src, wei;
  };
  Case& get(int64_t M) {
    auto it = cases_.find(M);
    if (it != cases_.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt t = bf16_ ? dt::bf16 : dt::f32;
    dnnl::memory::desc src_md({M, K_}, t, tag::ab), wei_md({K_, N_}, t, tag::any), dst_md({M, N_}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), eng_);
    note = pd.impl_info_str();
    Case c;
    c.prim = dnnl::matmul(pd);
    c.wei = dnnl::memory(pd.weights_desc(), eng_);
    dnnl::memory wsrc({{K_, N_}, dt::f32, tag::ba}, eng_, const_cast<float*>(w_));
    dnnl::reorder(wsrc, c.wei).execute(strm_, wsrc, c.wei);
    if (bf16_) {
      c.src = dnnl::memory(src_md, eng_);
      dnnl::memory::desc xf_md({M, K_}, dt::f32, tag::ab);
      c.cvt = dnnl::reorder(dnnl::reorder::primitive_desc(eng_, xf_md, eng_, src_md));
    }
    strm_.wait();
    return cases_.emplace(M, std::move(c)).first->second;
  }
  dnnl::engine& eng_;
  const float* w_;
  int64_t N_, K_;
  bool bf16_;
  dnnl::stream strm_;
  std::map<int64_t, Case> cases_;
};

// ---- measurement ----------------------------------------------------------------------------

struct Variant {
  std::string name;
  std::string kind;      // "quant", "float", "peer"
  double weight_bytes;   // bytes of weights read per call (for GB/s at M = 1)
  std::function<void(const float*, int64_t, float*)> run;
  std::string note;
};

struct Result {
  int64_t N, K, M;
  std::string variant, kind, kernel;
  double ms, gops, gbs;
  double best_ms = 0, best_gbs = 0;  // fastest run: on a loaded machine, the least-disturbed one
  double vs_bf16 = 0, vs_f32 = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string machine_line() {
  const auto& f = cpu_features();
  return fmt::format("{} | {} threads | avx512_vnni={} avx512_bf16={}", f.brand, thread_pool().size(),
                     supports_avx512_vnni(), supports_avx512_bf16());
}

}  // namespace

int run_bench_op(const BenchOpOptions& o) {
  std::vector<std::string> modes = o.modes;
  if (modes.empty())
    modes = {"w8a8", "w8a8-g128", "w8a8-g64", "w4a8", "w4a8-g128", "w8a16", "w4a16"};
  std::vector<pq::QuantMode> qmodes;
  for (const auto& m : modes) {
    auto q = pq::parse_quant_mode(m);
    PERRY_CHECK(q && pq::is_quantized(*q), "bench-op: unknown quantized mode '{}' (known: {})", m,
                pq::quant_mode_names());
    qmodes.push_back(*q);
  }
  std::vector<int64_t> ms = o.ms;
  if (ms.empty()) ms = o.quick ? std::vector<int64_t>{1, 128, 512} : std::vector<int64_t>{1, 16, 128, 512, 1024, 4096};
  std::vector<std::pair<int64_t, int64_t>> shapes = o.shapes;
  if (shapes.empty()) {
    if (o.quick) {
      shapes = {{4096, 4096}};
    } else {
      shapes = {{10240, 2560}, {2560, 10240}, {4096, 4096}, {1024, 4096},
                {14336, 4096}, {4096, 14336}, {4096, 12288}, {12288, 4096}};
    }
  }
  for (auto m : ms) PERRY_CHECK(m > 0, "bench-op: M must be positive, got {}", m);
  const bool have_vnni = supports_avx512_vnni();
  fmt::print("bench-op: {}\n", machine_line());

  // Memory-bandwidth ceiling, measured here: all threads stream-read a 512 MiB buffer (huge pages),
  // median of 5 passes after a warm-up pass.
  double membw = 0;
  if (have_vnni) {
    const int64_t bytes = int64_t(512) << 20;
    AlignedBuffer<uint8_t> buf(static_cast<size_t>(bytes));
    std::memset(buf.data(), 1, size_t(bytes));
    std::vector<double> bw;
    std::atomic<uint64_t> sink{0};
    for (int r = 0; r < 6; ++r) {
      auto t0 = Clock::now();
      thread_pool().run_on_all([&](int t, int nt) {
        const int64_t chunk = bytes / nt / 256 * 256;
        sink += kernels::q::avx512::stream_read(buf.data() + t * chunk, chunk);
      });
      if (r > 0) bw.push_back(double(bytes) / std::chrono::duration<double>(Clock::now() - t0).count() * 1e-9);
    }
    membw = median(bw);
    fmt::print("memory read bandwidth (all threads, 512 MiB): {:.1f} GB/s\n", membw);
  }

  AlignedBuffer<uint8_t> flush(size_t(96) << 20);
  std::memset(flush.data(), 2, flush.size());
  uint64_t flush_sink = 0;
  std::vector<uint64_t> flush_part(size_t(thread_pool().size()), 0);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  std::vector<Result> results;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);

  for (auto [N, K] : shapes) {
    PERRY_CHECK(N > 0 && K > 0, "bench-op: bad shape {}x{}", N, K);
    fmt::print("\n== N={} K={} ==\n", N, K);
    std::vector<float> w(size_t(N * K));
    for (auto& v : w) v = nd(rng) * 0.02f;
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);

    std::vector<Variant> vars;
    std::vector<std::unique_ptr<pq::QuantizedLinear>> qlins;
    for (auto qm : qmodes) {
      auto lin = std::make_unique<pq::QuantizedLinear>(pq::quantize_weight(w.data(), N, K, qm));
      const auto sc = pq::quant_scheme(qm);
      // w8a8-fp8 on the CPU streams its weights decoded to bf16 (kernels/cpu/qgemm.h, PackedFp8).
      const double wbytes = double(N) * K * (sc.fp8 ? 2.0 : sc.weight_bits / 8.0);
      pq::QuantizedLinear* lp = lin.get();
      vars.push_back({std::string(pq::quant_mode_name(qm)), "quant", wbytes,
                      [lp](const float* x, int64_t M, float* y) { lp->forward(x, M, y); }, ""});
      qlins.push_back(std::move(lin));
    }
    auto fl_bf16 = std::make_unique<kernels::FloatLinear>(wb.data(), DType::BF16, N, K);
    auto fl_f32 = std::make_unique<kernels::FloatLinear>(w.data(), DType::F32, N, K);
    vars.push_back({"bf16", "float", double(N) * K * 2,
                    [&](const float* x, int64_t M, float* y) { fl_bf16->forward(x, M, y); }, ""});
    vars.push_back({"f32", "float", double(N) * K * 4,
                    [&](const float* x, int64_t M, float* y) { fl_f32->forward(x, M, y); }, ""});
    // Peers.
    std::unique_ptr<pq::QuantizedWeight> w8;
    std::unique_ptr<OnednnInt8> dn_int8;
    if (have_vnni) {
      w8 = std::make_unique<pq::QuantizedWeight>(pq::quantize_weight(w.data(), N, K, pq::QuantMode::W8A8));
      dn_int8 = std::make_unique<OnednnInt8>(eng, *w8);
      vars.push_back({"onednn-int8", "peer", double(N) * K,
                      [&](const float* x, int64_t M, float* y) { dn_int8->run(x, M, y); }, ""});
    }
    // (oneDNN's bf16 matmul needs AVX-512: below it the peer row is left out, not faked.)
    std::unique_ptr<OnednnFloat> dn_bf16;
    if (kernels::supports_onednn_bf16_matmul()) {
      dn_bf16 = std::make_unique<OnednnFloat>(eng, w.data(), N, K, true);
      vars.push_back({"onednn-bf16", "peer", double(N) * K * 2,
                      [&](const float* x, int64_t M, float* y) { dn_bf16->run(x, M, y); }, ""});
    }
    auto dn_f32 = std::make_unique<OnednnFloat>(eng, w.data(), N, K, false);
    vars.push_back({"onednn-f32", "peer", double(N) * K * 4,
                    [&](const float* x, int64_t M, float* y) { dn_f32->run(x, M, y); }, ""});
    vars.push_back({"openblas-f32", "peer", double(N) * K * 4,
                    [&](const float* x, int64_t M, float* y) {
                      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(N), blasint(K), 1.0f, x,
                                  blasint(K), w.data(), blasint(K), 0.0f, y, blasint(N));
                    },
                    ""});
    // No OpenBLAS bf16 peer: Debian's OpenBLAS 0.3.21 is built without BUILD_BFLOAT16 (no cblas_sbgemm).
    for (int64_t M : ms) {
      AlignedBuffer<float> x(size_t(M * K)), y(size_t(M * N));
      for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng);
      const double ops = 2.0 * double(M) * double(N) * double(K);
      // Warm-up (also creates the per-M library primitives), then estimate a run's cost.
      std::vector<double> est(vars.size());
      for (size_t v = 0; v < vars.size(); ++v) {
        vars[v].run(x.data(), M, y.data());
        auto t0 = Clock::now();
        vars[v].run(x.data(), M, y.data());
        est[v] = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      const double slowest = *std::max_element(est.begin(), est.end());
      int reps = o.repeats > 0 ? o.repeats : (o.quick ? 3 : (slowest > 1.0 ? 3 : slowest > 0.1 ? 5 : 11));
      std::vector<std::vector<double>> t(vars.size());
      for (int r = 0; r < reps; ++r)
        for (size_t v = 0; v < vars.size(); ++v) {  // alternate variants
          // Small M is memory-bound: evict the previous variant's weights from L3 (32 MiB) first,
          // or a layer whose weights happen to fit there would be timed from cache.
          // Let the other libraries' spinning workers go to sleep before timing the next one.
          std::this_thread::sleep_for(std::chrono::milliseconds(3));
          // Then wake every pool thread (busy ~1 ms, then the flush read split across them), so the
          // timed call does not pay the VM's idle-vCPU wake-up: decode runs kernels back to back
          // and never sees that latency (measured: without this, M=1 medians were 2-5x the best).
          thread_pool().run_on_all([&](int t, int nt) {
            auto until = Clock::now() + std::chrono::microseconds(1000);
            while (Clock::now() < until) {
            }
            if (M <= 16 && have_vnni) {
              const int64_t n = int64_t(flush.size()), b = n * t / nt, e = n * (t + 1) / nt;
              flush_part[size_t(t)] = kernels::q::avx512::stream_read(flush.data() + b, e - b);
            }
          });
          for (auto v2 : flush_part) flush_sink += v2;
          auto t0 = Clock::now();
          vars[v].run(x.data(), M, y.data());
          t[v].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
      double best_bf16 = 1e30, best_f32 = 1e30;
      std::vector<double> med(vars.size());
      for (size_t v = 0; v < vars.size(); ++v) {
        med[v] = median(t[v]);
        const auto& nm = vars[v].name;
        if (nm == "bf16" || nm == "onednn-bf16") best_bf16 = std::min(best_bf16, med[v]);
        if (nm == "f32" || nm == "onednn-f32" || nm == "openblas-f32") best_f32 = std::min(best_f32, med[v]);
      }
      fmt::print("M={:<5} {:<14} {:>10} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8}  kernel\n", M, "variant", "ms", "GOP/s",
                 "GB/s", "x bf16", "x f32", "best ms", "best GB/s");
      for (size_t v = 0; v < vars.size(); ++v) {
        Result r{N, K, M, vars[v].name, vars[v].kind, "", med[v] * 1e3, ops / med[v] * 1e-9,
                 vars[v].weight_bytes / med[v] * 1e-9};
        r.best_ms = *std::min_element(t[v].begin(), t[v].end()) * 1e3;
        r.best_gbs = vars[v].weight_bytes / (r.best_ms * 1e-3) * 1e-9;
        r.vs_bf16 = best_bf16 / med[v];
        r.vs_f32 = best_f32 / med[v];
        if (vars[v].kind == "quant") r.kernel = qlins[v]->kernel_name(M);
        if (vars[v].name == "bf16") r.kernel = fl_bf16->kernel_name(M);
        if (vars[v].name == "f32") r.kernel = fl_f32->kernel_name(M);
        if (vars[v].name == "onednn-int8") r.kernel = dn_int8->note;
        if (vars[v].name == "onednn-bf16" && dn_bf16) r.kernel = dn_bf16->note;
        if (vars[v].name == "onednn-f32") r.kernel = dn_f32->note;
        fmt::print("        {:<14} {:>10.3f} {:>9.1f} {:>8.1f} {:>8.2f} {:>8.2f} {:>9.3f} {:>8.1f}  {}\n", r.variant, r.ms,
                   r.gops, M == 1 ? r.gbs : 0.0, r.vs_bf16, r.vs_f32, r.best_ms, M == 1 ? r.best_gbs : 0.0, r.kernel);
        results.push_back(r);
      }
      std::fflush(stdout);
    }
  }

  if (!o.out_prefix.empty()) {
    nlohmann::json j;
    j["machine"] = machine_line();
    j["memory_read_gbs"] = membw;
    j["results"] = nlohmann::json::array();
    for (const auto& r : results)
      j["results"].push_back({{"N", r.N}, {"K", r.K}, {"M", r.M}, {"variant", r.variant}, {"kind", r.kind},
                              {"kernel", r.kernel}, {"ms", r.ms}, {"gops", r.gops}, {"gbs", r.gbs},
                              {"vs_best_bf16", r.vs_bf16}, {"vs_best_f32", r.vs_f32},
                              {"best_ms", r.best_ms}, {"best_gbs", r.best_gbs}});
    std::ofstream(o.out_prefix + ".json") << j.dump(1) << "\n";
    std::ofstream md(o.out_prefix + ".md");
    md << "# perry bench-op\n\n" << machine_line() << "\n\n";
    md << fmt::format("Memory read bandwidth measured in this run (all threads, 512 MiB, huge pages): {:.1f} GB/s\n\n", membw);
    md << "Medians of alternating runs after warm-up. `x bf16` / `x f32`: speed relative to the best bf16 / f32 "
          "variant (perry FloatLinear, oneDNN; OpenBLAS for f32 — Debian's OpenBLAS has no bf16 GEMM) of the same run. GB/s: weight bytes per second.\n\n";
    md << "| N | K | M | variant | ms | GOP/s | GB/s | x bf16 | x f32 | best ms | kernel |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : results)
      md << fmt::format("| {} | {} | {} | {} | {:.3f} | {:.1f} | {} | {:.2f} | {:.2f} | {:.3f} | {} |\n", r.N, r.K, r.M,
                        r.variant, r.ms, r.gops, r.M == 1 ? fmt::format("{:.1f}", r.gbs) : "", r.vs_bf16, r.vs_f32,
                        r.best_ms, r.kernel);
    fmt::print("\nwrote {}.md and {}.json\n", o.out_prefix, o.out_prefix);
  }
  return flush_sink == 1 ? 0 : 0;  // (uses the checksum so the flush reads stay)
}

}  // namespace perry::bench
