#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/backend_kernels.h"
#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/device_memory.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemv_decode.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/lab_timeline.h"

namespace perry::cuda {

namespace {

// The device KV cache of one model::KvCache: bf16 keys and values, per layer
// [n_slots][n_kv][capacity][hd] (the layout attention.h reads).
struct DeviceKv {
  DeviceBuffer k, v;
  size_t layer_elems = 0;
  uint64_t id = 0;  // unique per allocation: recorded CUDA graphs are keyed by it, not by address
};
uint64_t next_kv_id() {
  static std::atomic<uint64_t> n{0};
  return ++n;
}

template <typename T>
DeviceBuffer upload_vector(DevicePool& pool, const std::vector<T>& v, const std::string& what) {
  DeviceBuffer b(pool, v.size() * sizeof(T), what);
  copy_to_device(b.get(), v.data(), v.size() * sizeof(T));
  return b;
}

class CudaBackend final : public model::ForwardBackend {
 public:
  CudaBackend(const model::Model& m, const CudaBackendOptions& o,
              const std::function<void(int64_t, int64_t, const std::string&)>& progress);
  ~CudaBackend() override;

  void forward(const std::vector<model::SeqInput>& batch, model::KvCache& cache, std::vector<float>& logits) override;
  // The greedy tokens picked on the GPU (argmax_rows after lm_head, in the decode graph), so a
  // step returns 4 bytes a sequence instead of its vocabulary-wide logits row.
  void forward_greedy(const std::vector<model::SeqInput>& batch, model::KvCache& cache,
                      std::vector<int32_t>& next) override;
  // Each step's argmax also writes the next step's input on the device (GreedyFeed), so step i + 1
  // is enqueued before step i's tokens reach the host: the GPU runs the steps back to back
  // instead of idling while the host waits, reads the tokens and uploads the next step.
  int64_t decode_greedy(const std::vector<model::SeqInput>& batch, model::KvCache& cache, int64_t max_steps,
                        const model::GreedyStepFn& on_step) override;
  std::string name() const override { return name_; }
  std::string kernel_summary() const override;
  int64_t preferred_prefill_chunk() const override { return 8192; }
  void synchronize() override { PERRY_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  size_t peak_memory() const { return pool_.peak(); }
  double linears_ms(int M);

 private:
  struct Layer {
    DeviceBuffer in_norm, post_norm, q_norm, k_norm;
    CudaLinear qkv, o, gate_up, down;  // q|k|v and gate|up: rows concatenated, one GEMM each
  };
  // One forward pass as the kernels see it (the host-side batch description is in meta_).
  struct Step {
    int M = 0, n_seqs = 0, out_rows = 0, max_new = 0, max_ctx = 0, cap = 0;
    bool decode = true;
    bool greedy = false;  // the step ends in argmax_rows and returns token ids, not logits
    // Greedy decode steps enqueued (and recorded) as one: each step's argmax feeds the next its
    // token and embedding row on the device, so the steps run as one chain of programmatic
    // dependent launches, with no graph boundary or host copy between them (decode_greedy).
    int steps = 1;
    const DeviceKv* kv = nullptr;
    std::vector<std::pair<int, int>> gather;  // (first row, rows) runs of wanted rows; empty = all of x
  };
  Step run_step(const std::vector<model::SeqInput>& batch, model::KvCache& cache, bool greedy);
  // The step's shape, each slot's length taken `ahead` positions further (steps enqueued but not
  // yet in the cache: decode_greedy); then the batch description for meta_, and the launch (the
  // greedy tokens copied to host_tokens).
  Step plan_step(const std::vector<model::SeqInput>& batch, model::KvCache& cache, bool greedy, int ahead = 0);
  void upload_meta(const std::vector<model::SeqInput>& batch, const model::KvCache& cache, const Step& st);
  void launch_step(const Step& st, int32_t* host_tokens);
  void enqueue(const Step& st);  // st.steps steps
  void enqueue_one(const Step& st, int j);  // step j of them
  void enqueue_decode_one(const Step& st, int j);
  // The logits to the host, or the greedy tokens of step j to next_ + j * out_rows.
  void enqueue_output(const Step& st, const float* logits, int j);
  void decode_linear(const CudaLinear& l, DecodeIn in, const float* x, const DeviceBuffer* norm, DecodeOut out,
                     float* y, const DecodeRopeKv* rope_kv = nullptr, const CudaLinear* next = nullptr);
  void run_graph(const Step& st);
  void clear_graphs();
  DeviceKv& device_kv(model::KvCache& cache);
  void ensure_scratch(int M, int out_rows, int n_seqs, int max_ctx);
  ActOut act_out();            // where a norm / SwiGLU writes the next linear's input
  LinearInput linear_in() const;    // the same buffers, read by the linear
  void to_linear_input(const float* x, int M, int K);  // fp32 rows → the linear input format

  const model::Model& model_;
  const io::ModelConfig& cfg_;
  CudaBackendOptions opts_;
  // Recorded decode steps by (batch rows, context bucket, KV storage); null = seen once, not yet
  // recorded. Invalidated when a scratch buffer is reallocated (scratch_gen_ moves).
  using GraphKey = std::tuple<int, int, uint64_t, bool, int>;  // (..., greedy, steps)
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  uint64_t scratch_gen_ = 0, graph_gen_ = 0;
  DevicePool pool_;
  cudaStream_t stream_ = nullptr;
  LinearContext lctx_;
  std::string name_;
  ActFormat act_fmt_;
  std::vector<Layer> layers_;
  // One-token steps run the fused decode path (gemv_decode [+ rope_append_qkv]: 6-7 kernels a
  // layer) when every linear fits it; PERRY_NO_FUSED_DECODE=1 keeps the separate kernels (A/B).
  bool fused_decode_ = false;
  // RoPE + KV append in the q|k|v GEMV's epilogue (models without q/k norm), one kernel less a
  // layer (w4a8-g128 decode +4% on the H200, docs/perf/cuda/decode-run8-summary.md);
  // PERRY_DECODE_ROPE_IN_QKV=0 keeps rope_append_qkv for A/B runs (gemv_decode.h, RopeKv).
  bool rope_in_qkv_ = false;
  // Bulk-copy ring stages per warp of every decode linear: -1 = the kernel's choice per input kind
  // (plain or RMSNorm); PERRY_GEMV_DECODE_STAGES=n (0 = register loads) forces it for A/B runs (gemv_decode.h,
  // DecodeLinearArgs::bulk_stages).
  int decode_bulk_stages_ = -1;
  // PERRY_GEMV_DECODE_NORM_STAGES=n: the RMSNorm-input linears' ring stages alone (A/B runs).
  int decode_norm_stages_ = -1;
  // Register double buffering of the per-channel w8a8 decode linears: -1 = the kernel's choice;
  // PERRY_GEMV_DECODE_PIPE=0 turns it off for A/B runs (gemv_decode.h, register_pipe).
  int decode_register_pipe_ = -1;
  // Bytes of gate|up's weights that o_proj's blocks bring into L2 (decode_linear's `next`):
  // PERRY_DECODE_L2_NEXT_MB=n (lab: off by default — measured −0.5% w8a8, −1.1% w4a8-g128, s20-run1).
  size_t decode_l2_next_bytes_ = 0;
  // PERRY_LAB_DECODE_INPUT=skip|read: lab only, wrong outputs (gemv_decode.h, lab_input).
  DecodeLabInput decode_lab_input_ = DecodeLabInput::Build;
  // PERRY_LAB_DECODE_BOUNDARIES=n: lab only — an empty n-block kernel after each of a layer's five
  // steps of a one-token step (q|k|v, attention, o, gate|up, down; four without attention), to
  // measure what a kernel boundary costs (backend_kernels.h, lab_boundary).
  int decode_lab_boundaries_ = 0;
  // PERRY_LAB_DECODE_WEIGHTS=skip|noloop: lab only, wrong outputs (gemv_decode.h, lab_weights).
  DecodeLabWeights decode_lab_weights_ = DecodeLabWeights::Read;
  // PERRY_LAB_DECODE_ATTENTION=skip: lab only, wrong outputs — no decode attention kernels (o_proj
  // reads whatever the attention buffer holds), to measure what they cost a step.
  bool decode_lab_skip_attention_ = false;
  // PERRY_LAB_DECODE_TIMELINE=file: lab only — a record of every decode GEMV and attention block
  // (start, PDL wait passed, input built, end), written to the file when the backend closes
  // (kernels/cuda/lab_timeline.h; PERRY_LAB_DECODE_TIMELINE_RECORDS sets the capacity: 1 Mi records,
  // 64 MiB of device memory, by default — a 24-token decode of Llama-3-8B writes ~430 K).
  std::unique_ptr<LabTimeline> lab_timeline_;
  // Prefill q/k/v: rope_append_qkv + attention reading q in place (+ bf16 output for bf16
  // linears) instead of split_qkv, rope_apply, kv_cache_append and a conversion pass;
  // PERRY_PREFILL_SEPARATE=1 keeps the separate kernels for A/B runs.
  bool prefill_fused_ = true;
  // The gate|up values are rounded to bf16 before SwiGLU, in every mode, step and M: where the
  // layer's kernel can write bf16 (bf16_output: the tensor-core GEMMs, cuBLAS) it does — the
  // [M, 2I] output is the largest activation of a prefill, written by the GEMM and read by
  // SwiGLU, and bf16 halves both — and where it cannot (the small-M kernels, the fused one-token
  // kernel) SwiGLU rounds, so a prompt gives the same values alone or in a batch, as a prefill or
  // token by token. bf16 values are also what a bf16 model in transformers computes there.
  // PERRY_GATE_UP_F32=1 keeps fp32 throughout (the CPU backend's values).
  bool gate_up_bf16_ = true;
  // Whether gate|up writes bf16 for M rows (else fp32, rounded by SwiGLU when gate_up_bf16_).
  bool gate_up_writes_bf16(const Layer& L, int M) const;
  void gate_up(const Layer& L, const LinearInput& in, int M);
  // Runs gate|up and SwiGLU over M rows into the MLP activation (act_out()).
  void gate_up_swiglu(const Layer& L, const LinearInput& in, int M, int I);
  // So do the q|k|v projections (PERRY_QKV_F32=1 keeps fp32): written as bf16 by the GEMM where
  // it can — rope_append_qkv then writes q back as bf16 and attention reads it so — else rounded
  // by rope_append_qkv / split_qkv / the fused decode kernel's epilogue.
  bool qkv_bf16_ = true;
  // (Where attention computes with bf16 q, so that the fused path's bf16 q and the separate
  // path's fp32 one give the same bits.)
  bool qkv_writes_bf16(const Layer& L, int M) const {
    return qkv_bf16_ && L.qkv.bf16_output(M) && attention_prefill_rounds_q(int(cfg_.head_dim));
  }
  // The residual deltas (o_proj and down_proj outputs) follow the same rule: rounded to bf16
  // before the residual add in every step — written as bf16 by the GEMM where it can (half the
  // bytes of a [M, H] output written and read), else rounded by the add (add_rms_norm /
  // residual_add round_delta, gemv_decode's Accumulate round_bf16). The residual stream itself
  // stays fp32. transformers' bf16 models round there too. PERRY_DELTA_F32=1 keeps fp32.
  bool delta_bf16_ = true;
  bool delta_writes_bf16(const CudaLinear& lin, int M) const { return delta_bf16_ && lin.bf16_output(M); }
  // lin's output of M rows into delta_ (bf16 where delta_writes_bf16, else fp32).
  void residual_delta(const CudaLinear& lin, const LinearInput& in, int M);
  // lin over M rows into out, as bf16 bits when `bf16` (a *_writes_bf16 rule said so), else fp32.
  void run_linear(const CudaLinear& lin, const LinearInput& in, int M, bool bf16, const DeviceBuffer& out);
  // x += delta_ (as residual_delta wrote it for lin), then next_norm ? RMSNorm into act_out().
  void add_delta(const CudaLinear& lin, int M, const DeviceBuffer* next_norm);
  // The prefill attention kernel: the library's choice, or PERRY_PREFILL_ATTN=64 / 128 (rows a
  // block) / wgmma (hd 128 on sm_90; what Auto takes there for long prompts) for A/B runs.
  PrefillKernel prefill_attn_ = PrefillKernel::Auto;
  DeviceBuffer embed_, final_norm_, rope_cos_, rope_sin_;
  DType embed_dtype_ = DType::BF16;
  RopeTableView rope_view_;
  CudaLinear lm_head_;
  // Scratch, grown to the largest batch seen.
  int scratch_m_ = 0, scratch_rows_ = 0, scratch_seqs_ = 0;
  size_t attn_ws_bytes_ = 0;
  DeviceBuffer x_, act_bf16_, act_i8_, act_scale_, qkv_, q_, k_, v_, attn_, delta_, gu_, xlast_, logits_, attn_ws_;
  DeviceBuffer meta_;  // tokens [M], positions [M], AttnSeq [n_seqs]
  std::vector<uint8_t> host_meta_;
  float* host_logits_ = nullptr;  // pinned
  DeviceBuffer next_;               // greedy tokens [decode_graph_steps_][out_rows]
  DeviceBuffer argmax_ws_;          // argmax_rows' scratch (zeroed when allocated)
  int32_t* host_next_ = nullptr;    // pinned, 2 × decode_graph_steps_ × out_rows: two launches in flight
  cudaEvent_t tokens_ready_[2] = {nullptr, nullptr};  // decode_greedy: a launch's tokens in host_next_
  // PERRY_DECODE_OVERLAP=0: decode_greedy waits for each step like forward_greedy (A/B runs).
  bool overlap_decode_ = true;
  // decode_greedy's steps a launch (Step::steps), PERRY_DECODE_GRAPH_STEPS=n (1 = a graph a step).
  int decode_graph_steps_ = 4;
};

CudaBackend::CudaBackend(const model::Model& m, const CudaBackendOptions& o,
                         const std::function<void(int64_t, int64_t, const std::string&)>& progress)
    : model_(m), cfg_(m.config()), opts_(o), pool_(o.device), act_fmt_(input_format(m.mode())) {
  name_ = fmt::format("cuda:{} ({})", o.device, describe_device(o.device));
  PERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  check_cublas(cublasCreate(&lctx_.cublas), "cublasCreate");
  check_cublas(cublasSetStream(lctx_.cublas, stream_), "cublasSetStream");
  // A fixed workspace keeps cuBLAS from allocating during a forward (and graph capture legal).
  lctx_.cublas_workspace = DeviceBuffer(pool_, 32 << 20, "cuBLAS workspace");
  check_cublas(cublasSetWorkspace(lctx_.cublas, lctx_.cublas_workspace.get(), lctx_.cublas_workspace.bytes()),
               "cublasSetWorkspace");
  lctx_.stream = stream_;
  lctx_.pool = &pool_;
  lctx_.splitk_flags = DeviceBuffer(pool_, size_t(kGemmW8A8TileFlags) * 4, "GEMM split-K tile flags");
  PERRY_CUDA_CHECK(cudaMemsetAsync(lctx_.splitk_flags.get(), 0, lctx_.splitk_flags.bytes(), stream_));

  const io::TensorView& e = m.embedding();
  embed_dtype_ = e.dtype;
  embed_ = DeviceBuffer(pool_, e.nbytes, "embedding table");
  copy_to_device(embed_.get(), e.data, e.nbytes);
  final_norm_ = upload_vector(pool_, m.final_norm(), "final norm");
  {
    const kernels::RopeTable& r = m.rope();
    const size_t n = size_t(r.max_positions()) * size_t(r.head_dim() / 2);
    std::vector<float> c(r.cos(0), r.cos(0) + n), s(r.sin(0), r.sin(0) + n);
    rope_cos_ = upload_vector(pool_, c, "RoPE cos table");
    rope_sin_ = upload_vector(pool_, s, "RoPE sin table");
    rope_view_ = RopeTableView{rope_cos_.get<float>(), rope_sin_.get<float>(), r.head_dim(), r.max_positions()};
  }
  const auto& L = m.layers();
  const int64_t total = int64_t(L.size()) + 1;
  for (size_t i = 0; i < L.size(); ++i) {
    if (progress) progress(int64_t(i), total, "uploading layer " + std::to_string(i));
    const model::DecoderLayer& s = L[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer d;
    d.in_norm = upload_vector(pool_, s.in_norm, p + "input_layernorm");
    d.post_norm = upload_vector(pool_, s.post_norm, p + "post_attention_layernorm");
    if (cfg_.qk_norm) {
      d.q_norm = upload_vector(pool_, s.q_norm, p + "q_norm");
      d.k_norm = upload_vector(pool_, s.k_norm, p + "k_norm");
    }
    d.qkv = CudaLinear::upload(pool_, {&s.q, &s.k, &s.v}, p + "self_attn.q_proj|k_proj|v_proj");
    d.o = CudaLinear::upload(pool_, {&s.o}, p + "self_attn.o_proj");
    d.gate_up = CudaLinear::upload(pool_, {&s.gate, &s.up}, p + "mlp.gate_proj|up_proj");
    d.down = CudaLinear::upload(pool_, {&s.down}, p + "mlp.down_proj");
    for (const CudaLinear* l : {&d.qkv, &d.o, &d.gate_up, &d.down})
      PERRY_CHECK(l->input_format() == act_fmt_, "{}: layers of mixed activation formats are not supported on CUDA",
                  p);
    layers_.push_back(std::move(d));
  }
  if (progress) progress(total - 1, total, "uploading lm_head");
  lm_head_ = CudaLinear::upload(pool_, {&m.lm_head()}, "lm_head");
  {
    size_t scratch = lm_head_.dequant_scratch_bytes();
    for (const Layer& d : layers_)
      for (const CudaLinear* l : {&d.qkv, &d.o, &d.gate_up, &d.down})
        scratch = std::max(scratch, l->dequant_scratch_bytes());
    if (scratch) lctx_.dequant_scratch.ensure(pool_, scratch, "dequantized weight scratch");
  }
  fused_decode_ = lm_head_.decode_fusable() && cfg_.head_dim % 2 == 0;
  for (const Layer& d : layers_)
    for (const CudaLinear* l : {&d.qkv, &d.o, &d.gate_up, &d.down}) fused_decode_ &= l->decode_fusable();
  if (env_flag("PERRY_NO_FUSED_DECODE")) fused_decode_ = false;
  rope_in_qkv_ = fused_decode_ && !cfg_.qk_norm && env_flag("PERRY_DECODE_ROPE_IN_QKV", true);
  decode_bulk_stages_ = env_int("PERRY_GEMV_DECODE_STAGES", -1, 0, 16);  // 0: register loads
  decode_register_pipe_ = env_int("PERRY_GEMV_DECODE_PIPE", -1, 0, 1);
  decode_l2_next_bytes_ = size_t(env_int("PERRY_DECODE_L2_NEXT_MB", 0, 0, 48)) << 20;
  decode_norm_stages_ = env_int("PERRY_GEMV_DECODE_NORM_STAGES", -1, 0, 16);
  if (decode_norm_stages_ == 1) throw Error("PERRY_GEMV_DECODE_NORM_STAGES=1: a ring needs 2 stages or more (0 = register loads)");
  decode_lab_input_ = env_choice("PERRY_LAB_DECODE_INPUT", DecodeLabInput::Build,
                                 {{"skip", DecodeLabInput::Skip}, {"read", DecodeLabInput::ReadOnly}},
                                 "lab only: wrong outputs");
  decode_lab_boundaries_ = env_int("PERRY_LAB_DECODE_BOUNDARIES", 0, 0, 4096);
  decode_lab_weights_ = env_choice("PERRY_LAB_DECODE_WEIGHTS", DecodeLabWeights::Read,
                                   {{"skip", DecodeLabWeights::Skip}, {"noloop", DecodeLabWeights::SkipLoop}},
                                   "lab only: wrong outputs");
  decode_lab_skip_attention_ = env_choice("PERRY_LAB_DECODE_ATTENTION", false, {{"skip", true}}, "lab only: wrong outputs");
  if (const char* tl = std::getenv("PERRY_LAB_DECODE_TIMELINE"); tl && *tl)
    lab_timeline_ = std::make_unique<LabTimeline>(tl, size_t(env_int("PERRY_LAB_DECODE_TIMELINE_RECORDS", 1 << 20, 1, 1 << 26)));
  if (decode_bulk_stages_ == 1) throw Error("PERRY_GEMV_DECODE_STAGES=1: a ring needs 2 stages or more (0 = register loads)");
  prefill_fused_ = !env_flag("PERRY_PREFILL_SEPARATE");
  overlap_decode_ = env_flag("PERRY_DECODE_OVERLAP", true);
  decode_graph_steps_ = env_int("PERRY_DECODE_GRAPH_STEPS", decode_graph_steps_, 1, 16);
  for (cudaEvent_t& e : tokens_ready_) PERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  gate_up_bf16_ = !env_flag("PERRY_GATE_UP_F32");
  delta_bf16_ = !env_flag("PERRY_DELTA_F32");
  qkv_bf16_ = !env_flag("PERRY_QKV_F32");
  prefill_attn_ = env_choice("PERRY_PREFILL_ATTN", PrefillKernel::Auto,
                             {{"64", PrefillKernel::Rows64}, {"128", PrefillKernel::Rows128}, {"wgmma", PrefillKernel::Wgmma}},
                             "rows a block, or wgmma: hd 128 on sm_90");
  if (progress) progress(total, total, "done");
  PERRY_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (lab_timeline_) {
    try {
      const size_t n = lab_timeline_->write();
      std::fprintf(stderr, "[perry] lab timeline: %zu block records written\n", n);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[perry] lab timeline: %s\n", e.what());
    }
  }
  clear_graphs();
  if (lctx_.cublas) cublasDestroy(lctx_.cublas);
  if (host_logits_) cudaFreeHost(host_logits_);
  if (host_next_) cudaFreeHost(host_next_);
  for (cudaEvent_t e : tokens_ready_)
    if (e) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

DeviceKv& CudaBackend::device_kv(model::KvCache& cache) {
  if (!cache.backend_state()) {
    auto kv = std::make_shared<DeviceKv>();
    kv->id = next_kv_id();
    kv->layer_elems = size_t(cache.n_slots()) * size_t(cache.n_kv_heads()) * size_t(cache.capacity()) *
                      size_t(cache.head_dim());
    const size_t bytes = kv->layer_elems * size_t(cache.n_layers()) * 2;
    const std::string what = fmt::format("the KV cache ({} sequences × {} positions, bf16)", cache.n_slots(),
                                         cache.capacity());
    kv->k = DeviceBuffer(pool_, bytes, what + " keys");
    kv->v = DeviceBuffer(pool_, bytes, what + " values");
    cache.set_backend_state(kv);
  }
  return *static_cast<DeviceKv*>(cache.backend_state().get());
}

void CudaBackend::ensure_scratch(int M, int out_rows, int n_seqs, int max_ctx) {
  const size_t H = size_t(cfg_.hidden_size), Q = size_t(cfg_.q_dim()), KV = size_t(cfg_.kv_dim()),
               I = size_t(cfg_.intermediate_size), V = size_t(cfg_.vocab_size);
  if (M > scratch_m_) {
    const size_t m = size_t(M);
    const size_t widest = std::max({H, Q, I});
    x_.ensure(pool_, m * H * 4, "activations (residual stream)");
    if (act_fmt_ == ActFormat::BF16) act_bf16_.ensure(pool_, m * widest * 2, "activations (bf16 linear input)");
    else {
      act_i8_.ensure(pool_, m * widest, "activations (int8 linear input)");
      act_scale_.ensure(pool_, m * 4, "activation scales");
    }
    qkv_.ensure(pool_, m * (Q + 2 * KV) * 4, "q|k|v projections");
    q_.ensure(pool_, m * Q * 4, "attention queries");
    k_.ensure(pool_, m * KV * 4, "attention keys");
    v_.ensure(pool_, m * KV * 4, "attention values");
    attn_.ensure(pool_, m * Q * 4, "attention output");
    delta_.ensure(pool_, m * H * 4, "layer outputs");
    if (!layers_.empty() && layers_[0].gate_up.fp8_act_bytes(M) > 0) {  // w8a8-fp8: any layer's input
      lctx_.fp8_act.ensure(pool_, m * widest, "activations (e4m3 linear input)");
      lctx_.fp8_scale.ensure(pool_, m * 4, "e4m3 activation scales");
    }
    gu_.ensure(pool_, m * 2 * I * 4, "MLP gate|up");
    scratch_m_ = M;
    ++scratch_gen_;
  }
  if (!layers_.empty()) {  // the W*A8 GEMMs' split-K partial sums: not monotone in M (only small M splits)
    const Layer& L0 = layers_[0];  // every layer has the same shapes
    // (and the LM head's at the step's output rows: a quantized head at batched decode takes the
    // small-M kernel, whose stream-K needs the workspace)
    const size_t sk = std::max({L0.qkv.splitk_bytes(M), L0.o.splitk_bytes(M), L0.gate_up.splitk_bytes(M),
                                L0.down.splitk_bytes(M), lm_head_.splitk_bytes(std::max(out_rows, 1))});
    if (sk > lctx_.splitk.bytes()) {
      lctx_.splitk.ensure(pool_, sk, "split-K partial sums");
      ++scratch_gen_;  // a captured decode graph holds the old pointer
    }
  }
  if (out_rows > scratch_rows_) {
    xlast_.ensure(pool_, size_t(out_rows) * H * 4, "final hidden states");
    logits_.ensure(pool_, size_t(out_rows) * V * 4, "logits");
    const size_t hb = size_t(out_rows) * V * 4;
    if (host_logits_) cudaFreeHost(host_logits_);
    host_logits_ = nullptr;
    PERRY_CUDA_CHECK(cudaMallocHost(&host_logits_, hb));
    const size_t per_launch = size_t(decode_graph_steps_) * size_t(out_rows);
    next_.ensure(pool_, per_launch * 4, "greedy tokens");
    if (host_next_) cudaFreeHost(host_next_);
    host_next_ = nullptr;
    PERRY_CUDA_CHECK(cudaMallocHost(&host_next_, 2 * per_launch * 4));
    argmax_ws_.ensure(pool_, argmax_scratch_bytes(out_rows, int64_t(V)), "greedy argmax scratch");
    PERRY_CUDA_CHECK(cudaMemsetAsync(argmax_ws_.get(), 0, argmax_ws_.bytes(), stream_));
    scratch_rows_ = out_rows;
    ++scratch_gen_;
    // (The final norm writes the lm_head input into the activation buffers: out_rows <= M fits.)
  }
  const size_t ws = attention_decode_workspace_bytes(n_seqs, int(cfg_.num_heads), int(cfg_.head_dim), max_ctx);
  if (ws > attn_ws_bytes_) {
    attn_ws_.ensure(pool_, ws, "attention workspace");
    attn_ws_bytes_ = ws;
    ++scratch_gen_;
  }
  const size_t meta = size_t(scratch_m_) * 8 + size_t(std::max(n_seqs, scratch_seqs_)) * sizeof(AttnSeq) + 64;
  if (meta > meta_.bytes()) {
    meta_.ensure(pool_, meta, "batch metadata");
    ++scratch_gen_;
  }
  scratch_seqs_ = std::max(scratch_seqs_, n_seqs);
}

ActOut CudaBackend::act_out() {
  return act_fmt_ == ActFormat::BF16 ? ActOut::bf16(act_bf16_.get<uint16_t>())
                                     : ActOut::i8(act_i8_.get<int8_t>(), act_scale_.get<float>());
}

LinearInput CudaBackend::linear_in() const {
  LinearInput in;
  in.bf16 = act_bf16_.get<uint16_t>();
  in.i8 = act_i8_.get<int8_t>();
  in.scale = act_scale_.get<float>();
  return in;
}

void CudaBackend::to_linear_input(const float* x, int M, int K) {
  if (act_fmt_ == ActFormat::BF16) f32_to_bf16(x, act_bf16_.get<uint16_t>(), int64_t(M) * K, stream_);
  else quantize_per_token(x, DType::F32, M, K, act_i8_.get<int8_t>(), act_scale_.get<float>(), stream_);
}

void CudaBackend::forward(const std::vector<model::SeqInput>& batch, model::KvCache& cache, std::vector<float>& logits) {
  const Step st = run_step(batch, cache, false);
  const size_t n = size_t(st.out_rows) * size_t(cfg_.vocab_size);
  logits.resize(n);
  std::memcpy(logits.data(), host_logits_, n * 4);
}

void CudaBackend::forward_greedy(const std::vector<model::SeqInput>& batch, model::KvCache& cache,
                                 std::vector<int32_t>& next) {
  const Step st = run_step(batch, cache, true);  // (Model::forward_greedy rejects all_logits rows)
  next.assign(host_next_, host_next_ + st.out_rows);
}

// One forward pass: the batch description uploaded, the kernels enqueued (or the step's graph
// replayed), the stream waited for; its output is in host_logits_ or, greedy, host_next_.
CudaBackend::Step CudaBackend::run_step(const std::vector<model::SeqInput>& batch, model::KvCache& cache,
                                        bool greedy) {
  Step st = plan_step(batch, cache, greedy);
  ensure_scratch(st.M, st.out_rows, st.n_seqs, st.max_ctx);
  upload_meta(batch, cache, st);
  launch_step(st, host_next_);
  for (const model::SeqInput& s : batch) cache.advance(s.slot, s.n_tokens);
  cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) throw_cuda("CUDA forward pass (a kernel failed; rerun with CUDA_LAUNCH_BLOCKING=1 to name it)", e);
  return st;
}

CudaBackend::Step CudaBackend::plan_step(const std::vector<model::SeqInput>& batch, model::KvCache& cache,
                                         bool greedy, int ahead) {
  Step st;
  st.greedy = greedy;
  st.n_seqs = int(batch.size());
  st.cap = int(cache.capacity());
  bool rows_in_order = true;
  for (const model::SeqInput& s : batch) {
    PERRY_CHECK(s.slot >= 0 && s.slot < cache.n_slots(), "KV cache slot {} out of range", s.slot);
    const int first = s.all_logits ? st.M : st.M + int(s.n_tokens) - 1;
    const int n = s.all_logits ? int(s.n_tokens) : 1;
    rows_in_order &= first == st.out_rows;
    st.gather.push_back({first, n});
    st.M += int(s.n_tokens);
    st.out_rows += n;
    st.max_ctx = std::max(st.max_ctx, int(cache.length(s.slot) + ahead + s.n_tokens));
    st.max_new = std::max(st.max_new, int(s.n_tokens));
    st.decode &= s.n_tokens == 1;
  }
  // Every row wanted, in order (decode, or perplexity windows): the final norm reads x directly.
  if (rows_in_order && st.out_rows == st.M) st.gather.clear();
  // Decode steps replay a CUDA graph: the launch configuration may depend only on (batch size,
  // context bucket), so attention gets the context rounded up to a power of two (its blocks past
  // a sequence's real length exit at once).
  if (opts_.cuda_graphs && st.decode) {
    int b = 256;
    while (b < st.max_ctx) b *= 2;
    st.max_ctx = std::min(b, st.cap);
  }
  st.kv = &device_kv(cache);
  return st;
}

// One upload of the batch description: token ids, positions, per-sequence attention records.
void CudaBackend::upload_meta(const std::vector<model::SeqInput>& batch, const model::KvCache& cache, const Step& st) {
  const int V = int(cfg_.vocab_size), M = st.M;
  host_meta_.resize(size_t(M) * 8 + size_t(st.n_seqs) * sizeof(AttnSeq));
  auto* tok = reinterpret_cast<int32_t*>(host_meta_.data());
  auto* pos = tok + M;
  auto* seq = reinterpret_cast<AttnSeq*>(pos + M);
  int row = 0;
  for (int i = 0; i < st.n_seqs; ++i) {
    const model::SeqInput& s = batch[size_t(i)];
    const int pos0 = int(cache.length(s.slot));
    for (int t = 0; t < int(s.n_tokens); ++t) {
      const int32_t id = s.tokens[t];
      if (id < 0 || id >= V) fail("token id {} is outside the vocabulary (0..{})", id, V - 1);
      tok[row + t] = id;
      pos[row + t] = pos0 + t;
    }
    seq[i] = AttnSeq{row, int32_t(s.n_tokens), pos0, int32_t(s.slot)};
    row += int(s.n_tokens);
  }
  PERRY_CUDA_CHECK(
      cudaMemcpyAsync(meta_.get(), host_meta_.data(), host_meta_.size(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::launch_step(const Step& st, int32_t* host_tokens) {
  if (opts_.cuda_graphs && st.decode) run_graph(st);
  else enqueue(st);
  if (st.greedy)
    PERRY_CUDA_CHECK(cudaMemcpyAsync(host_tokens, next_.get<int32_t>(), size_t(st.steps) * size_t(st.out_rows) * 4,
                                     cudaMemcpyDeviceToHost, stream_));
}

int64_t CudaBackend::decode_greedy(const std::vector<model::SeqInput>& batch, model::KvCache& cache,
                                   int64_t max_steps, const model::GreedyStepFn& on_step) {
  if (!overlap_decode_ || max_steps < 2) return ForwardBackend::decode_greedy(batch, cache, max_steps, on_step);
  const int n = int(batch.size());
  // Every buffer the run's longest step needs, now: one reallocated while a step is in flight
  // would lose the fed tokens (meta_) or move under that step.
  {
    const Step last = plan_step(batch, cache, true, int(max_steps - 1));
    ensure_scratch(last.M, last.out_rows, last.n_seqs, last.max_ctx);
  }
  const uint64_t gen = scratch_gen_;
  const size_t slot_tokens = size_t(decode_graph_steps_) * size_t(n);  // host_next_ holds two launches
  int64_t done = 0;      // steps whose tokens the host has (and the cache holds)
  int64_t launched = 0;  // steps enqueued
  int steps_of[2] = {0, 0};          // launch i's steps in slot i % 2 (tokens_ready_, host_next_)
  int64_t n_launches = 0, oldest = 0;  // launches enqueued; the first whose tokens the host lacks
  // The next decode_graph_steps_ steps (fewer at the end: never a step past max_steps, whose
  // cache entries might not fit), (launched - done) steps ahead of the cache.
  auto launch = [&] {
    const int k = int(std::min<int64_t>(decode_graph_steps_, max_steps - launched));
    Step st = plan_step(batch, cache, true, int(launched - done + k - 1));  // the context of its last step
    st.steps = k;
    if (launched == 0) upload_meta(batch, cache, st);  // later steps read what the step before fed
    const int slot = int(n_launches % 2);
    launch_step(st, host_next_ + size_t(slot) * slot_tokens);
    PERRY_CUDA_CHECK(cudaEventRecord(tokens_ready_[slot], stream_));
    PERRY_CHECK(scratch_gen_ == gen, "decode_greedy: a scratch buffer moved during the run");
    steps_of[slot] = k;
    ++n_launches;
    launched += k;
  };
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  try {
    launch();
    for (bool stop = false; !stop;) {
      if (launched < max_steps) launch();
      const int slot = int(oldest++ % 2);
      cudaError_t e = cudaEventSynchronize(tokens_ready_[slot]);
      if (e != cudaSuccess) throw_cuda("CUDA decode step (a kernel failed; rerun with CUDA_LAUNCH_BLOCKING=1 to name it)", e);
      for (int j = 0; j < steps_of[slot] && !stop; ++j) {
        std::copy_n(host_next_ + size_t(slot) * slot_tokens + size_t(j) * size_t(n), n, tokens.begin());
        for (const model::SeqInput& s : batch) cache.advance(s.slot, 1);
        ++done;
        // A stop leaves the steps enqueued ahead to finish: their cache entries lie past the
        // lengths, where the next steps fed write their own.
        stop = !on_step(tokens) || done == max_steps;
      }
    }
  } catch (...) {
    cudaStreamSynchronize(stream_);
    throw;
  }
  cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) throw_cuda("CUDA decode step", e);
  return done;
}

void CudaBackend::run_graph(const Step& st) {
  if (graph_gen_ != scratch_gen_) {  // a buffer moved: recorded graphs point at freed memory
    clear_graphs();
    graph_gen_ = scratch_gen_;
  }
  const GraphKey key{st.M, st.max_ctx, st.kv->id, st.greedy, st.steps};
  auto it = graphs_.find(key);
  if (it != graphs_.end() && it->second) {
    PERRY_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    return;
  }
  if (it == graphs_.end()) {  // first time: run eagerly (kernels set their attributes once), record next time
    graphs_[key] = nullptr;
    enqueue(st);
    return;
  }
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  PERRY_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue(st);
  } catch (...) {
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  PERRY_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
  cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) throw_cuda("cudaGraphInstantiate (decode step)", e);
  it->second = exec;
  PERRY_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

void CudaBackend::clear_graphs() {
  for (auto& [k, g] : graphs_)
    if (g) cudaGraphExecDestroy(g);
  graphs_.clear();
}

// A decode weight row's bytes (bf16, int8 or packed int4).
static size_t decode_row_bytes(const DecodeWeights& w) {
  const int bits = w.mode == quant::QuantMode::BF16 ? 16 : quant_mode_bits(w.mode).bits;
  return size_t(w.K) * size_t(bits) / 8;
}

// next: the linear after this one, whose first rows this one's blocks bring into L2 before their
// wait (DecodeLinearArgs::l2_next) — given for o_proj, whose blocks start during attention
// (attention_decode's combine triggers them early) when HBM is otherwise idle. Only where all of
// this linear's weights fit the rings its blocks fill before the wait (3 stages of 4 KiB a warp,
// 16 warps, one block an SM): then the prefetch follows the block's own copies and delays none of
// its loop. Up to decode_l2_next_bytes_, split between the gate and up halves (gate|up's blocks
// walk both halves row by row from the top).
void CudaBackend::decode_linear(const CudaLinear& l, DecodeIn in, const float* x, const DeviceBuffer* norm,
                                DecodeOut out, float* y, const DecodeRopeKv* rope_kv, const CudaLinear* next) {
  DecodeLinearArgs a;
  a.x = x;
  a.in = in;
  a.norm_w = norm ? norm->get<float>() : nullptr;
  a.eps = float(cfg_.rms_norm_eps);
  a.y = y;
  a.out = out;
  a.bulk_stages = in == DecodeIn::RmsNorm && decode_norm_stages_ >= 0 ? decode_norm_stages_ : decode_bulk_stages_;
  a.register_pipe = decode_register_pipe_;
  a.lab_weights = decode_lab_weights_;
  a.lab_input = decode_lab_input_;
  // The bf16-intermediate rules (see gate_up_bf16_): q|k|v, gate|up and the residual deltas;
  // the logits stay fp32.
  a.round_bf16 = &l == &lm_head_ ? false
                 : out == DecodeOut::Accumulate ? delta_bf16_
                 : out == DecodeOut::SwiGLU     ? gate_up_bf16_
                                                : qkv_bf16_;
  if (rope_kv) a.rope_kv = *rope_kv;
  const DecodeWeights w = l.decode_weights();
  if (next && decode_l2_next_bytes_ > 0 && decode_bulk_stages_ < 0 &&
      size_t(w.N) * decode_row_bytes(w) <= size_t(sm_count()) * 3 * 16 * 4096) {
    const DecodeWeights nw = next->decode_weights();
    const size_t half = size_t(nw.N / 2) * decode_row_bytes(nw);
    const size_t each = std::min(half, decode_l2_next_bytes_ / 2) / 16 * 16;
    const auto* base = static_cast<const uint8_t*>(nw.w);
    a.l2_next[0] = {base, each};
    a.l2_next[1] = {base + half, each};
  }
  gemv_decode(w, a, stream_);
}

// One token of one sequence: 6 kernels a layer (7 with q/k norm), each linear carrying the
// elementwise work around it — qkv (RMSNorm in; RoPE + KV append out, or a separate RoPE + q/k
// norm + KV append kernel), attention partial + combine, o (residual
// add out), gate|up (RMSNorm in, SwiGLU out), down (residual add out) — launched with
// programmatic dependent launch so each one's weight prefetch overlaps the kernel before it.
void CudaBackend::enqueue_decode_one(const Step& st, int j) {
  const int H = int(cfg_.hidden_size), Q = int(cfg_.q_dim()), KV = int(cfg_.kv_dim());
  const int nh = int(cfg_.num_heads), nkv = int(cfg_.num_kv_heads), hd = int(cfg_.head_dim);
  const int V = int(cfg_.vocab_size);
  auto* d_tok = meta_.get<int32_t>();
  auto* d_seq = reinterpret_cast<AttnSeq*>(d_tok + 2);
  float* x = x_.get<float>();
  float* qkv = qkv_.get<float>();
  float* attn = attn_.get<float>();
  float* act = gu_.get<float>();
  const float scale = 1.0f / std::sqrt(float(hd));
  const DeviceKv& kv = *st.kv;
  // Lab: one more kernel boundary after each of the layer's steps (decode_lab_boundaries_).
  auto boundary = [&] {
    if (decode_lab_boundaries_ > 0) lab_boundary(decode_lab_boundaries_, stream_);
  };
  if (j == 0) embedding_lookup(embed_.get(), embed_dtype_, H, d_tok, 1, x, stream_, V);  // (later: fed)
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    uint16_t* kc = kv.k.get<uint16_t>() + l * kv.layer_elems;
    uint16_t* vc = kv.v.get<uint16_t>() + l * kv.layer_elems;
    if (rope_in_qkv_) {
      const DecodeRopeKv rk{d_seq, rope_view_, nh, nkv, hd, st.cap, kc, vc};
      decode_linear(L.qkv, DecodeIn::RmsNorm, x, &L.in_norm, DecodeOut::RopeKv, qkv, &rk);
    } else {
      decode_linear(L.qkv, DecodeIn::RmsNorm, x, &L.in_norm, DecodeOut::Store, qkv);
      rope_append_qkv(qkv, Q + 2 * KV, d_seq, 1, 1, nh, nkv, hd, cfg_.qk_norm ? L.q_norm.get<float>() : nullptr,
                         cfg_.qk_norm ? L.k_norm.get<float>() : nullptr, float(cfg_.rms_norm_eps), rope_view_, st.cap,
                         kc, vc, stream_);
    }
    boundary();
    if (!decode_lab_skip_attention_) {
      attention_decode(qkv, d_seq, 1, st.max_ctx, kc, vc, nh, nkv, hd, st.cap, scale, attn, attn_ws_.get<float>(),
                       attn_ws_.bytes(), stream_);
      boundary();
    }
    decode_linear(L.o, DecodeIn::Plain, attn, nullptr, DecodeOut::Accumulate, x, nullptr, &L.gate_up);
    boundary();
    decode_linear(L.gate_up, DecodeIn::RmsNorm, x, &L.post_norm, DecodeOut::SwiGLU, act);
    boundary();
    decode_linear(L.down, DecodeIn::Plain, act, nullptr, DecodeOut::Accumulate, x);
    boundary();
  }
  float* dl = logits_.get<float>();
  decode_linear(lm_head_, DecodeIn::RmsNorm, x, &final_norm_, DecodeOut::Store, dl);
  enqueue_output(st, dl, j);
}

void CudaBackend::enqueue_output(const Step& st, const float* logits, int j) {
  const int64_t V = cfg_.vocab_size;
  if (st.greedy) {
    // A decode step also leaves its tokens as the next step's input (what decode_greedy relies
    // on; other callers upload the next step's description over it).
    GreedyFeed feed;
    if (st.decode) {
      feed.tok = meta_.get<int32_t>();
      feed.pos = feed.tok + st.M;
      feed.seq = reinterpret_cast<AttnSeq*>(feed.pos + st.M);
      // x's rows are free once lm_head has read them: the next step's embedding goes there (a
      // decode step's rows are its sequences, one token each, so row r of x is row r's token).
      feed.x = x_.get<float>();
      feed.table = embed_.get();
      feed.table_dtype = embed_dtype_;
      feed.hidden = int64_t(cfg_.hidden_size);
    }
    // (launch_step copies them out)
    argmax_rows(logits, st.out_rows, V, next_.get<int32_t>() + size_t(j) * size_t(st.out_rows), argmax_ws_.get(),
                stream_, feed);
  } else {
    PERRY_CUDA_CHECK(cudaMemcpyAsync(host_logits_, logits, size_t(st.out_rows) * size_t(V) * 4,
                                     cudaMemcpyDeviceToHost, stream_));
  }
}

// Every kernel of st.steps forward passes, from the token ids in meta_ to the logits in pinned
// host memory (or the greedy tokens in next_).
void CudaBackend::enqueue(const Step& st) {
  PERRY_CHECK(st.steps == 1 || (st.greedy && st.decode), "several steps a launch need greedy decode steps");
  for (int j = 0; j < st.steps; ++j) enqueue_one(st, j);
}

void CudaBackend::enqueue_one(const Step& st, int j) {
  if (st.M == 1 && st.decode && fused_decode_) return enqueue_decode_one(st, j);
  const int H = int(cfg_.hidden_size), Q = int(cfg_.q_dim()), KV = int(cfg_.kv_dim()), I = int(cfg_.intermediate_size);
  const int nh = int(cfg_.num_heads), nkv = int(cfg_.num_kv_heads), hd = int(cfg_.head_dim);
  const int V = int(cfg_.vocab_size);
  const int M = st.M, n_seqs = st.n_seqs;
  auto* d_tok = meta_.get<int32_t>();
  auto* d_pos = d_tok + M;
  auto* d_seq = reinterpret_cast<AttnSeq*>(d_pos + M);
  float* x = x_.get<float>();
  // One row: q, k and v are already contiguous inside the fused projection's output (unless
  // split_qkv has to round them to bf16).
  float* qkv = qkv_.get<float>();
  uint16_t* qkv16 = qkv_.get<uint16_t>();  // the same buffer where the projection writes bf16
  const bool split = M > 1 || qkv_bf16_;
  float* q = split ? q_.get<float>() : qkv;
  float* k = split ? k_.get<float>() : qkv + Q;
  float* v = split ? v_.get<float>() : qkv + Q + KV;
  float* attn = attn_.get<float>();
  const float eps = float(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(float(hd));
  const LinearInput in = linear_in();
  const DeviceKv& kv = *st.kv;

  if (j == 0) embedding_lookup(embed_.get(), embed_dtype_, H, d_tok, M, x, stream_, V);  // (later: fed)
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    if (l == 0) rms_norm(x, L.in_norm.get<float>(), eps, M, H, act_out(), stream_);
    // (later layers: the previous layer's residual add already normalized x into the input)
    const bool qkv16_out = qkv_writes_bf16(L, M);
    run_linear(L.qkv, in, M, qkv16_out, qkv_);
    uint16_t* kc = kv.k.get<uint16_t>() + l * kv.layer_elems;
    uint16_t* vc = kv.v.get<uint16_t>() + l * kv.layer_elems;
    const float* qn = cfg_.qk_norm ? L.q_norm.get<float>() : nullptr;
    const float* kn = cfg_.qk_norm ? L.k_norm.get<float>() : nullptr;
    if (!st.decode && prefill_fused_) {
      // q/k norm, RoPE and the cache append in one pass over q|k|v; attention reads q in place
      // (bf16 where the projection wrote bf16) and writes o_proj's input itself.
      PrefillIo io;
      if (qkv16_out) {
        rope_append_qkv(qkv16, Q + 2 * KV, d_seq, n_seqs, M, nh, nkv, hd, qn, kn, eps, rope_view_, st.cap, kc, vc,
                        stream_);
        io.q_bf16 = qkv16;
      } else {
        rope_append_qkv(qkv, Q + 2 * KV, d_seq, n_seqs, M, nh, nkv, hd, qn, kn, eps, rope_view_, st.cap, kc, vc,
                        stream_, qkv_bf16_);
        io.q = qkv;
      }
      // The int8 modes take it as bf16 too (in attn_), then quantize per token: half the bytes
      // of an fp32 output written and read, and the same values o_proj sees in bf16 mode.
      io.q_stride = Q + 2 * KV;
      io.out_bf16 = act_fmt_ == ActFormat::BF16 ? act_bf16_.get<uint16_t>() : attn_.get<uint16_t>();
      attention_prefill(io, d_seq, n_seqs, st.max_new, st.max_ctx, kc, vc, nh, nkv, hd, st.cap, scale, stream_,
                        prefill_attn_);
      if (act_fmt_ != ActFormat::BF16)
        quantize_per_token(io.out_bf16, DType::BF16, M, Q, act_i8_.get<int8_t>(), act_scale_.get<float>(), stream_);
    } else {
      if (qkv16_out) split_qkv(qkv16, M, Q, KV, q, k, v, stream_);
      else if (split) split_qkv(qkv, M, Q, KV, q, k, v, stream_, qkv_bf16_);
      if (cfg_.qk_norm) {
        head_rms_norm(q, Q, M, nh, hd, qn, eps, stream_);
        head_rms_norm(k, KV, M, nkv, hd, kn, eps, stream_);
      }
      rope_apply(q, Q, nh, k, KV, nkv, M, d_pos, rope_view_, stream_);
      kv_cache_append(k, v, d_seq, n_seqs, M, nkv, hd, st.cap, kc, vc, stream_);
      if (st.decode)
        attention_decode(q, d_seq, n_seqs, st.max_ctx, kc, vc, nh, nkv, hd, st.cap, scale, attn,
                         attn_ws_.get<float>(), attn_ws_.bytes(), stream_);
      else
        attention_prefill(q, d_seq, n_seqs, st.max_new, st.max_ctx, kc, vc, nh, nkv, hd, st.cap, scale, attn,
                          stream_, prefill_attn_);
      if (!st.decode && act_fmt_ == ActFormat::I8) {
        // The fused path's values: the output rounded to bf16 (in q_, free after attention), then
        // quantized — so PERRY_PREFILL_SEPARATE gives the same bits.
        uint16_t* ab = q_.get<uint16_t>();
        f32_to_bf16(attn, ab, int64_t(M) * Q, stream_);
        quantize_per_token(ab, DType::BF16, M, Q, act_i8_.get<int8_t>(), act_scale_.get<float>(), stream_);
      } else {
        to_linear_input(attn, M, Q);
      }
    }
    residual_delta(L.o, in, M);
    add_delta(L.o, M, &L.post_norm);
    gate_up_swiglu(L, in, M, I);
    residual_delta(L.down, in, M);
    add_delta(L.down, M, l + 1 < layers_.size() ? &layers_[l + 1].in_norm : nullptr);
  }

  // Only the rows whose logits are wanted go through the final norm and lm_head.
  const float* xl = x;
  if (!st.gather.empty()) {
    float* dst = xlast_.get<float>();
    int r = 0;
    for (auto [first, n] : st.gather) {
      PERRY_CUDA_CHECK(cudaMemcpyAsync(dst + size_t(r) * H, x + size_t(first) * H, size_t(n) * H * 4,
                                       cudaMemcpyDeviceToDevice, stream_));
      r += n;
    }
    xl = dst;
  }
  rms_norm(xl, final_norm_.get<float>(), eps, st.out_rows, H, act_out(), stream_);
  float* dl = logits_.get<float>();
  lm_head_.forward(in, st.out_rows, dl, lctx_);
  enqueue_output(st, dl, j);
}

bool CudaBackend::gate_up_writes_bf16(const Layer& L, int M) const {
  return gate_up_bf16_ && L.gate_up.bf16_output(M);
}

// gate|up into gu_ (bf16 where gate_up_writes_bf16, else fp32), without SwiGLU.
void CudaBackend::gate_up(const Layer& L, const LinearInput& in, int M) {
  run_linear(L.gate_up, in, M, gate_up_writes_bf16(L, M), gu_);
}

void CudaBackend::run_linear(const CudaLinear& lin, const LinearInput& in, int M, bool bf16, const DeviceBuffer& out) {
  if (bf16) lin.forward_bf16(in, M, out.get<uint16_t>(), lctx_);
  else lin.forward(in, M, out.get<float>(), lctx_);
}

void CudaBackend::residual_delta(const CudaLinear& lin, const LinearInput& in, int M) {
  run_linear(lin, in, M, delta_writes_bf16(lin, M), delta_);
}

void CudaBackend::add_delta(const CudaLinear& lin, int M, const DeviceBuffer* next_norm) {
  const int H = int(cfg_.hidden_size);
  const float eps = float(cfg_.rms_norm_eps);
  float* x = x_.get<float>();
  if (delta_writes_bf16(lin, M)) {
    const uint16_t* d = delta_.get<uint16_t>();
    if (next_norm) add_rms_norm(x, d, next_norm->get<float>(), eps, M, H, act_out(), stream_);
    else residual_add(x, d, int64_t(M) * H, stream_);
  } else {
    const float* d = delta_.get<float>();
    if (next_norm) add_rms_norm(x, d, next_norm->get<float>(), eps, M, H, act_out(), stream_, delta_bf16_);
    else residual_add(x, d, int64_t(M) * H, stream_, delta_bf16_);
  }
}

void CudaBackend::gate_up_swiglu(const Layer& L, const LinearInput& in, int M, int I) {
  gate_up(L, in, M);
  if (gate_up_writes_bf16(L, M)) swiglu(gu_.get<uint16_t>(), M, I, act_out(), stream_);
  else swiglu(gu_.get<float>(), M, I, act_out(), stream_, gate_up_bf16_);
}

// The linear layers of one forward of M rows alone (every layer's q, k, v, o, gate|up, down and
// lm_head on one row), timed with CUDA events: what "time outside the GEMMs" is measured against.
// Runs on the scratch buffers (whatever they hold: the values do not change the time of a GEMM
// much, and they are the activations of the last real forward, not zeros).
double CudaBackend::linears_ms(int M) {
  ensure_scratch(M, 1, 1, 256);
  const LinearInput in = linear_in();
  auto run = [&] {
    for (const Layer& L : layers_) {
      run_linear(L.qkv, in, M, qkv_writes_bf16(L, M), qkv_);
      residual_delta(L.o, in, M);
      gate_up(L, in, M);
      residual_delta(L.down, in, M);
    }
    lm_head_.forward(in, 1, logits_.get<float>(), lctx_);
  };
  run();  // warm-up
  cudaEvent_t a, b;
  PERRY_CUDA_CHECK(cudaEventCreate(&a));
  PERRY_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < 3; ++r) {
    PERRY_CUDA_CHECK(cudaEventRecord(a, stream_));
    run();
    PERRY_CUDA_CHECK(cudaEventRecord(b, stream_));
    PERRY_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    PERRY_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[1];
}

std::string CudaBackend::kernel_summary() const {
  if (layers_.empty()) return "";
  const auto& l0 = layers_[0];
  std::string s = "  device: " + name_ + "\n";
  s += "  attention/mlp linears: M=1 → " + l0.gate_up.kernel_name(1) + ", M=512 → " + l0.gate_up.kernel_name(512) +
       "\n";
  // Batched decode (16 sequences a step): the small-M routes differ by layer shape (linear_path).
  s += "  batched decode, M=16: q|k|v → " + l0.qkv.kernel_name(16) + ", o → " + l0.o.kernel_name(16) +
       ", gate|up → " + l0.gate_up.kernel_name(16) + ", down → " + l0.down.kernel_name(16) + "\n";
  s += "  lm_head: M=1 → " + lm_head_.kernel_name(1) + ", M=512 → " + lm_head_.kernel_name(512) + "\n";
  s += std::string("  attention: prefill → ") + attention_prefill_kernel_name(int(cfg_.head_dim)) +
       ", online softmax; decode → attention_decode (split-KV)\n";
  s += gate_up_bf16_ ? "  MLP: gate|up rounded to bf16 before SwiGLU (bf16 GEMM output where the kernel has one)\n"
                     : "  MLP: gate|up kept in fp32 (PERRY_GATE_UP_F32)\n";
  s += qkv_bf16_ ? "  attention: q|k|v rounded to bf16 before norm / RoPE (bf16 GEMM output where the kernel has one)\n"
                 : "  attention: q|k|v kept in fp32 (PERRY_QKV_F32)\n";
  s += delta_bf16_ ? "  residual adds: o_proj / down_proj outputs rounded to bf16 (bf16 GEMM output where the kernel has "
                     "one), fp32 residual stream\n"
                   : "  residual adds: o_proj / down_proj outputs kept in fp32 (PERRY_DELTA_F32)\n";
  s += fused_decode_ ? "  one-token decode: gemv_decode (RMSNorm / SwiGLU / residual add fused into the linears), "
                       "rope_append_qkv, programmatic dependent launch\n"
                     : "  one-token decode: separate kernels (PERRY_NO_FUSED_DECODE or a layer gemv_decode cannot take)\n";
  s += fmt::format("  GPU memory held: {}\n", mib(pool_.in_use()));
  return s;
}

}  // namespace

std::unique_ptr<model::ForwardBackend> make_cuda_backend(const model::Model& model, const CudaBackendOptions& opts,
                                                         const std::function<void(int64_t, int64_t, const std::string&)>& progress) {
  return std::make_unique<CudaBackend>(model, opts, progress);
}

std::string cuda_device_report(int device) { return describe_device(device); }

void require_cuda_device(int device) { require_device(device); }

double cuda_linears_ms(model::ForwardBackend* backend, int M) {
  auto* b = dynamic_cast<CudaBackend*>(backend);
  return b ? b->linears_ms(M) : 0.0;
}

size_t cuda_peak_memory(const model::ForwardBackend* backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(backend);
  return b ? b->peak_memory() : 0;
}

}  // namespace perry::cuda
