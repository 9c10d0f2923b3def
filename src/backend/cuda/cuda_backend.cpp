#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/device_memory.h"
#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_w8a8.h"

namespace perry::cuda {

namespace {

// The device KV cache of one model::KvCache: bf16 keys and values, per layer
// [n_slots][n_kv][capacity][hd] (the layout attention.h reads).
struct DeviceKv {
  DeviceBuffer k, v;
  size_t layer_elems = 0;
};

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
  std::string name() const override { return name_; }
  std::string kernel_summary() const override;
  int64_t preferred_prefill_chunk() const override { return 8192; }
  void synchronize() override { PERRY_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  size_t peak_memory() const { return pool_.peak(); }

 private:
  struct Layer {
    DeviceBuffer in_norm, post_norm, q_norm, k_norm;
    CudaLinear q, k, v, o, gate_up, down;
  };
  DeviceKv& device_kv(model::KvCache& cache);
  void ensure_scratch(int M, int out_rows, int n_seqs, int max_ctx);
  ActOut act_out();            // where a norm / SwiGLU writes the next linear's input
  LinearInput linear_in() const;    // the same buffers, read by the linear
  void to_linear_input(const float* x, int M, int K);  // fp32 rows → the linear input format

  const model::Model& model_;
  const io::ModelConfig& cfg_;
  DevicePool pool_;
  cudaStream_t stream_ = nullptr;
  LinearContext lctx_;
  std::string name_;
  ActFormat act_fmt_;
  std::vector<Layer> layers_;
  DeviceBuffer embed_, final_norm_, rope_cos_, rope_sin_;
  DType embed_dtype_ = DType::BF16;
  RopeTableView rope_view_;
  CudaLinear lm_head_;
  // Scratch, grown to the largest batch seen.
  int scratch_m_ = 0, scratch_rows_ = 0, scratch_seqs_ = 0;
  size_t attn_ws_bytes_ = 0;
  DeviceBuffer x_, act_bf16_, act_i8_, act_scale_, q_, k_, v_, attn_, delta_, gu_, xlast_, logits_, attn_ws_;
  DeviceBuffer meta_;  // tokens [M], positions [M], AttnSeq [n_seqs]
  std::vector<uint8_t> host_meta_;
  float* host_logits_ = nullptr;  // pinned
  size_t host_logits_bytes_ = 0;
};

CudaBackend::CudaBackend(const model::Model& m, const CudaBackendOptions& o,
                         const std::function<void(int64_t, int64_t, const std::string&)>& progress)
    : model_(m), cfg_(m.config()), pool_(o.device), act_fmt_(input_format(m.mode())) {
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
    d.q = CudaLinear::upload(pool_, {&s.q}, p + "self_attn.q_proj");
    d.k = CudaLinear::upload(pool_, {&s.k}, p + "self_attn.k_proj");
    d.v = CudaLinear::upload(pool_, {&s.v}, p + "self_attn.v_proj");
    d.o = CudaLinear::upload(pool_, {&s.o}, p + "self_attn.o_proj");
    d.gate_up = CudaLinear::upload(pool_, {&s.gate, &s.up}, p + "mlp.gate_proj|up_proj");
    d.down = CudaLinear::upload(pool_, {&s.down}, p + "mlp.down_proj");
    for (const CudaLinear* l : {&d.q, &d.k, &d.v, &d.o, &d.gate_up, &d.down})
      PERRY_CHECK(l->input_format() == act_fmt_, "{}: layers of mixed activation formats are not supported on CUDA",
                  p);
    layers_.push_back(std::move(d));
  }
  if (progress) progress(total - 1, total, "uploading lm_head");
  lm_head_ = CudaLinear::upload(pool_, {&m.lm_head()}, "lm_head");
  if (progress) progress(total, total, "done");
  PERRY_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (lctx_.cublas) cublasDestroy(lctx_.cublas);
  if (host_logits_) cudaFreeHost(host_logits_);
  if (stream_) cudaStreamDestroy(stream_);
}

DeviceKv& CudaBackend::device_kv(model::KvCache& cache) {
  if (!cache.backend_state()) {
    auto kv = std::make_shared<DeviceKv>();
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
    q_.ensure(pool_, m * Q * 4, "attention queries");
    k_.ensure(pool_, m * KV * 4, "attention keys");
    v_.ensure(pool_, m * KV * 4, "attention values");
    attn_.ensure(pool_, m * Q * 4, "attention output");
    delta_.ensure(pool_, m * H * 4, "layer outputs");
    gu_.ensure(pool_, m * 2 * I * 4, "MLP gate|up");
    scratch_m_ = M;
  }
  if (out_rows > scratch_rows_) {
    xlast_.ensure(pool_, size_t(out_rows) * H * 4, "final hidden states");
    logits_.ensure(pool_, size_t(out_rows) * V * 4, "logits");
    const size_t hb = size_t(out_rows) * V * 4;
    if (host_logits_) cudaFreeHost(host_logits_);
    PERRY_CUDA_CHECK(cudaMallocHost(&host_logits_, hb));
    host_logits_bytes_ = hb;
    scratch_rows_ = out_rows;
    // The final norm writes the lm_head input for out_rows rows: make sure it fits.
    if (out_rows > scratch_m_) ensure_scratch(out_rows, 0, 0, 0);
  }
  const size_t ws = attention_decode_workspace_bytes(n_seqs, int(cfg_.num_heads), int(cfg_.head_dim), max_ctx);
  if (ws > attn_ws_bytes_) {
    attn_ws_.ensure(pool_, ws, "attention workspace");
    attn_ws_bytes_ = ws;
  }
  const size_t meta = size_t(scratch_m_) * 8 + size_t(std::max(n_seqs, scratch_seqs_)) * sizeof(AttnSeq) + 64;
  if (meta > meta_.bytes()) meta_.ensure(pool_, meta, "batch metadata");
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
  const int H = int(cfg_.hidden_size), Q = int(cfg_.q_dim()), KV = int(cfg_.kv_dim()), I = int(cfg_.intermediate_size);
  const int nh = int(cfg_.num_heads), nkv = int(cfg_.num_kv_heads), hd = int(cfg_.head_dim);
  const int V = int(cfg_.vocab_size);
  const int n_seqs = int(batch.size());
  int M = 0, out_rows = 0, max_ctx = 0, max_new = 0;
  bool decode = true;
  for (const model::SeqInput& s : batch) {
    M += int(s.n_tokens);
    out_rows += s.all_logits ? int(s.n_tokens) : 1;
    max_ctx = std::max(max_ctx, int(cache.length(s.slot) + s.n_tokens));
    max_new = std::max(max_new, int(s.n_tokens));
    decode &= s.n_tokens == 1;
    PERRY_CHECK(s.slot >= 0 && s.slot < cache.n_slots(), "KV cache slot {} out of range", s.slot);
  }
  DeviceKv& kv = device_kv(cache);
  ensure_scratch(M, out_rows, n_seqs, max_ctx);

  // One upload of the batch description: token ids, positions, per-sequence attention records.
  host_meta_.resize(size_t(M) * 8 + size_t(n_seqs) * sizeof(AttnSeq));
  auto* tok = reinterpret_cast<int32_t*>(host_meta_.data());
  auto* pos = tok + M;
  auto* seq = reinterpret_cast<AttnSeq*>(pos + M);
  {
    int row = 0;
    for (int i = 0; i < n_seqs; ++i) {
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
  }
  auto* d_tok = meta_.get<int32_t>();
  auto* d_pos = d_tok + M;
  auto* d_seq = reinterpret_cast<AttnSeq*>(d_pos + M);
  PERRY_CUDA_CHECK(cudaMemcpyAsync(d_tok, host_meta_.data(), host_meta_.size(), cudaMemcpyHostToDevice, stream_));

  float* x = x_.get<float>();
  float* q = q_.get<float>();
  float* k = k_.get<float>();
  float* v = v_.get<float>();
  float* attn = attn_.get<float>();
  float* delta = delta_.get<float>();
  float* gu = gu_.get<float>();
  const float eps = float(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(float(hd));
  const LinearInput in = linear_in();
  const int cap = int(cache.capacity());

  embedding_lookup(embed_.get(), embed_dtype_, H, d_tok, M, x, stream_, V);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    if (l == 0) rms_norm(x, L.in_norm.get<float>(), eps, M, H, act_out(), stream_);
    // (later layers: the previous layer's residual add already normalized x into the input)
    L.q.forward(in, M, q, lctx_);
    L.k.forward(in, M, k, lctx_);
    L.v.forward(in, M, v, lctx_);
    if (cfg_.qk_norm) {
      head_rms_norm(q, Q, M, nh, hd, L.q_norm.get<float>(), eps, stream_);
      head_rms_norm(k, KV, M, nkv, hd, L.k_norm.get<float>(), eps, stream_);
    }
    rope_apply(q, Q, nh, k, KV, nkv, M, d_pos, rope_view_, stream_);
    uint16_t* kc = kv.k.get<uint16_t>() + l * kv.layer_elems;
    uint16_t* vc = kv.v.get<uint16_t>() + l * kv.layer_elems;
    kv_cache_append(k, v, d_seq, n_seqs, M, nkv, hd, cap, kc, vc, stream_);
    if (decode)
      attention_decode(q, d_seq, n_seqs, max_ctx, kc, vc, nh, nkv, hd, cap, scale, attn, attn_ws_.get<float>(),
                       attn_ws_.bytes(), stream_);
    else
      attention_prefill(q, d_seq, n_seqs, max_new, max_ctx, kc, vc, nh, nkv, hd, cap, scale, attn, stream_);
    to_linear_input(attn, M, Q);
    L.o.forward(in, M, delta, lctx_);
    add_rms_norm(x, delta, L.post_norm.get<float>(), eps, M, H, act_out(), stream_);
    L.gate_up.forward(in, M, gu, lctx_);
    swiglu(gu, M, I, act_out(), stream_);
    L.down.forward(in, M, delta, lctx_);
    if (l + 1 < layers_.size()) add_rms_norm(x, delta, layers_[l + 1].in_norm.get<float>(), eps, M, H, act_out(), stream_);
    else residual_add(x, delta, int64_t(M) * H, stream_);
  }
  for (const model::SeqInput& s : batch) cache.advance(s.slot, s.n_tokens);

  // Only the rows whose logits are wanted go through the final norm and lm_head.
  float* xl = xlast_.get<float>();
  {
    int off = 0, r = 0;
    for (const model::SeqInput& s : batch) {
      const int first = s.all_logits ? off : off + int(s.n_tokens) - 1;
      const int n = s.all_logits ? int(s.n_tokens) : 1;
      PERRY_CUDA_CHECK(cudaMemcpyAsync(xl + size_t(r) * H, x + size_t(first) * H, size_t(n) * H * 4,
                                       cudaMemcpyDeviceToDevice, stream_));
      r += n;
      off += int(s.n_tokens);
    }
  }
  rms_norm(xl, final_norm_.get<float>(), eps, out_rows, H, act_out(), stream_);
  float* dl = logits_.get<float>();
  lm_head_.forward(in, out_rows, dl, lctx_);
  const size_t lb = size_t(out_rows) * size_t(V) * 4;
  PERRY_CUDA_CHECK(cudaMemcpyAsync(host_logits_, dl, lb, cudaMemcpyDeviceToHost, stream_));
  cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) throw_cuda("CUDA forward pass (a kernel failed; rerun with CUDA_LAUNCH_BLOCKING=1 to name it)", e);
  logits.resize(size_t(out_rows) * size_t(V));
  std::memcpy(logits.data(), host_logits_, lb);
}

std::string CudaBackend::kernel_summary() const {
  if (layers_.empty()) return "";
  const CudaLinear& g = layers_[0].gate_up;
  std::string s = "  device: " + name_ + "\n";
  s += "  attention/mlp linears: M=1 → " + g.kernel_name(1) + ", M=512 → " + g.kernel_name(512) + "\n";
  s += "  lm_head: M=1 → " + lm_head_.kernel_name(1) + ", M=512 → " + lm_head_.kernel_name(512) + "\n";
  s += "  attention: prefill → attention_prefill (tensor cores, online softmax), decode → attention_decode (split-KV)\n";
  s += fmt::format("  GPU memory held: {}\n", mib(pool_.in_use()));
  return s;
}

}  // namespace

std::unique_ptr<model::ForwardBackend> make_cuda_backend(const model::Model& model, const CudaBackendOptions& opts,
                                                         const std::function<void(int64_t, int64_t, const std::string&)>& progress) {
  return std::make_unique<CudaBackend>(model, opts, progress);
}

std::string cuda_device_report(int device) { return describe_device(device); }

size_t cuda_peak_memory(const model::ForwardBackend* backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(backend);
  return b ? b->peak_memory() : 0;
}

}  // namespace perry::cuda
