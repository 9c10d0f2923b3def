#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/op_profile.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "model/tensor_names.h"

namespace perry::model {

namespace {

// PERRY_PROFILE: one counter per op of the forward pass (core/op_profile.h).
struct OpCounters {
  prof::Counter forward{"forward"}, embed{"embed"}, norm{"rms_norm"}, qkv{"attn.qkv_proj"}, qk_norm{"attn.qk_norm"},
      rope{"attn.rope"}, kv_store{"attn.kv_store"}, attention{"attn.attention"}, o{"attn.o_proj"},
      add{"residual_add"}, gate_up{"mlp.gate_up_proj"}, silu{"mlp.silu_mul"}, down{"mlp.down_proj"},
      lm_head{"lm_head"};
};
OpCounters& ops() {
  static OpCounters c;
  return c;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Checks a checkpoint tensor against what config.json implies.
void check_tensor(const WeightSource& src, const TensorSpec& spec) {
  const io::TensorView& t = src.get(spec.name);
  if (!is_float(t.dtype))
    fail("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", src.describe(), spec.name, dtype_name(t.dtype));
  if (t.shape != spec.shape) {
    io::TensorView want;
    want.shape = spec.shape;
    fail("{}: tensor '{}' has shape {} but config.json implies {} — the checkpoint and its config.json disagree",
         src.describe(), spec.name, t.shape_str(), want.shape_str());
  }
}

}  // namespace

std::unique_ptr<Model> Model::load(const LoadOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  std::optional<quant::QuantMode> file_mode;
  if (!opts.synthetic.empty()) {
    auto cfg = synthetic_preset(opts.synthetic);
    if (!cfg) {
      std::string names;
      for (const auto& n : synthetic_preset_names()) names += (names.empty() ? "" : ", ") + n;
      fail("unknown synthetic preset \"{}\" (available: {})", opts.synthetic, names);
    }
    m->src_ = std::make_shared<SyntheticWeights>(*cfg, opts.synthetic);
  } else {
    auto ckpt = std::make_shared<io::Checkpoint>(io::Checkpoint::open(opts.dir));
    const auto& qc = ckpt->config().quantization_config;
    if (qc.is_object()) {
      if (qc.value("quant_method", "") != "perry")
        fail("{}: quantization_config with quant_method \"{}\" is not supported (perry reads float checkpoints and its own quantized ones)",
             opts.dir, qc.value("quant_method", std::string("?")));
      auto mode = quant::parse_quant_mode(qc.value("mode", ""));
      if (!mode) fail("{}: unknown quantization mode \"{}\" in config.json", opts.dir, qc.value("mode", ""));
      file_mode = *mode;
    }
    m->src_ = std::make_shared<CheckpointWeights>(std::move(ckpt));
  }
  m->cfg_ = m->src_->config();
  if (file_mode && opts.quant && *opts.quant != *file_mode)
    fail("{} is already quantized as {}; it cannot be converted to {} (start from the float checkpoint)", opts.dir,
         quant::quant_mode_name(*file_mode), quant::quant_mode_name(*opts.quant));
  m->mode_ = file_mode ? *file_mode : opts.quant ? *opts.quant : quant::QuantMode::BF16;
  m->load_layers(opts);
  return m;
}

Linear Model::make_linear(const std::string& base, const LoadOptions& opts, bool is_lm_head,
                          const std::vector<float>* col_scale) {
  const WeightSource& src = *src_;
  const std::string wname = base + ".weight";
  const io::TensorView* bias = src.has(base + ".bias") ? &src.get(base + ".bias") : nullptr;
  if (src.has(base + ".qweight")) {
    // perry-quantized checkpoint: shapes come from config.json via the expected-tensor table.
    const auto& qc = cfg_.quantization_config;
    quant::QuantMode mode = mode_;
    if (qc.contains("modules") && qc["modules"].is_object() && qc["modules"].contains(base)) {
      auto m = quant::parse_quant_mode(qc["modules"][base].get<std::string>());
      if (!m) fail("{}: unknown mode for module {}", src.describe(), base);
      mode = *m;
    }
    int64_t N = 0, K = 0;
    for (const auto& spec : expected_tensors(cfg_))
      if (spec.name == wname) { N = spec.shape[0]; K = spec.shape[1]; }
    if (is_lm_head && N == 0) { N = cfg_.vocab_size; K = cfg_.hidden_size; }
    PERRY_CHECK(N > 0, "{}: unexpected quantized tensor {}", src.describe(), base);
    return Linear::from_quantized(mode, src.get(base + ".qweight"), src.get(base + ".scales"), bias, N, K,
                                  opts.pack_for_cpu);
  }
  quant::QuantMode mode = mode_;
  if (is_lm_head && !opts.quant_lm_head) mode = quant::QuantMode::BF16;
  if (!cfg_.quantization_config.is_null()) mode = quant::QuantMode::BF16;  // left float by perry quantize
  const io::TensorView& w = (is_lm_head && cfg_.tie_word_embeddings) ? embed_ : src.get(wname);
  if (col_scale) {
    // SmoothQuant: W[:, j] *= s_j (the preceding norm weight was divided by s_j).
    std::vector<float> wf = to_f32(w);
    const int64_t K = w.shape[1];
    for (size_t i = 0; i < wf.size(); ++i) wf[i] *= (*col_scale)[i % size_t(K)];
    owned_.push_back(std::move(wf));
    io::TensorView v = w;
    v.dtype = DType::F32;
    v.data = reinterpret_cast<const uint8_t*>(owned_.back().data());
    v.nbytes = owned_.back().size() * 4;
    Linear l = Linear::from_float(v, bias, mode, opts.pack_for_cpu);
    if (quant::is_quantized(mode)) owned_.pop_back();
    return l;
  }
  Linear l = Linear::from_float(w, bias, mode, opts.pack_for_cpu);
  if (quant::is_quantized(mode) && !(is_lm_head && cfg_.tie_word_embeddings)) src.release(wname);
  return l;
}

void Model::load_layers(const LoadOptions& opts) {
  const io::ModelConfig& c = cfg_;
  const WeightSource& src = *src_;
  const bool file_quantized = !c.quantization_config.is_null();
  // Validate every tensor before converting anything: errors name the tensor and the file.
  for (const TensorSpec& spec : expected_tensors(c)) {
    if (file_quantized && spec.kind == TensorKind::Linear) {
      const std::string base = spec.name.substr(0, spec.name.size() - 7);
      if (src.has(base + ".qweight")) continue;
    }
    if (!src.has(spec.name)) fail("{}: missing tensor '{}' (required by {})", src.describe(), spec.name, c.architecture_name);
    if (dynamic_cast<const SyntheticWeights*>(&src) == nullptr) check_tensor(src, spec);
  }
  embed_ = src.get("model.embed_tokens.weight");
  auto norm = [&](const std::string& name) {
    auto v = to_f32(src.get(name));
    norms_by_name_[name] = v;
    return v;
  };
  const int64_t total = c.num_layers + 1;
  layers_.resize(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (opts.progress) opts.progress(l, total, "layer " + std::to_string(l));
    const std::string p = layer_prefix(l);
    Layer& L = layers_[size_t(l)];
    L.in_norm = norm(p + "input_layernorm.weight");
    L.post_norm = norm(p + "post_attention_layernorm.weight");
    if (c.qk_norm) {
      L.q_norm = norm(p + "self_attn.q_norm.weight");
      L.k_norm = norm(p + "self_attn.k_norm.weight");
    }
    const std::vector<float>* sa = nullptr;
    const std::vector<float>* sm = nullptr;
    if (opts.smoothing && !opts.smoothing->empty()) {
      PERRY_CHECK(int64_t(opts.smoothing->attn.size()) == c.num_layers, "smoothing plan has the wrong layer count");
      sa = &opts.smoothing->attn[size_t(l)];
      sm = &opts.smoothing->mlp[size_t(l)];
      for (int64_t j = 0; j < c.hidden_size; ++j) {
        L.in_norm[size_t(j)] /= (*sa)[size_t(j)];
        L.post_norm[size_t(j)] /= (*sm)[size_t(j)];
      }
      norms_by_name_[p + "input_layernorm.weight"] = L.in_norm;
      norms_by_name_[p + "post_attention_layernorm.weight"] = L.post_norm;
      smoothed_ = true;
    }
    L.q = make_linear(p + "self_attn.q_proj", opts, false, sa);
    L.k = make_linear(p + "self_attn.k_proj", opts, false, sa);
    L.v = make_linear(p + "self_attn.v_proj", opts, false, sa);
    L.o = make_linear(p + "self_attn.o_proj", opts, false);
    L.gate = make_linear(p + "mlp.gate_proj", opts, false, sm);
    L.up = make_linear(p + "mlp.up_proj", opts, false, sm);
    L.down = make_linear(p + "mlp.down_proj", opts, false);
  }
  if (opts.progress) opts.progress(c.num_layers, total, "lm_head");
  final_norm_ = norm("model.norm.weight");
  lm_head_ = make_linear("lm_head", opts, true);
  if (opts.progress) opts.progress(total, total, "done");

  std::optional<kernels::Llama3RopeScaling> scaling;
  if (c.rope_scaling.type == io::RopeType::Llama3)
    scaling = kernels::Llama3RopeScaling{c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
                                         c.rope_scaling.high_freq_factor,
                                         double(c.rope_scaling.original_max_position_embeddings)};
  rope_ = std::make_unique<kernels::RopeTable>(int(c.head_dim), c.rope_theta, c.max_position_embeddings, scaling);
}

KvCache Model::make_cache(int64_t capacity, int64_t n_slots) const {
  PERRY_CHECK(capacity > 0 && capacity <= cfg_.max_position_embeddings,
              "context {} is outside 1..{} (the model's max_position_embeddings)", capacity,
              cfg_.max_position_embeddings);
  return KvCache(cfg_.num_layers, cfg_.num_kv_heads, cfg_.head_dim, capacity, n_slots);
}

int32_t greedy_token(const float* logits, int64_t vocab) {
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
  return int32_t(best < 0 ? 0 : best);
}

void greedy_tokens(const std::vector<float>& logits, size_t rows, std::vector<int32_t>& next) {
  next.resize(rows);
  if (rows == 0) return;
  const int64_t vocab = int64_t(logits.size() / rows);
  for (size_t i = 0; i < rows; ++i) next[i] = greedy_token(logits.data() + int64_t(i) * vocab, vocab);
}

void ForwardBackend::forward_greedy(const std::vector<SeqInput>& batch, KvCache& cache, std::vector<int32_t>& next) {
  std::vector<float> logits;
  forward(batch, cache, logits);
  greedy_tokens(logits, batch.size(), next);
}

namespace {
// decode_greedy one step at a time through `pick` (a forward_greedy): the host between steps.
int64_t decode_greedy_stepwise(const std::vector<SeqInput>& batch, KvCache& cache, int64_t max_steps,
                               const GreedyStepFn& on_step,
                               const std::function<void(const std::vector<SeqInput>&, KvCache&, std::vector<int32_t>&)>& pick) {
  std::vector<int32_t> fed(batch.size()), next;
  std::vector<SeqInput> step = batch;
  for (size_t i = 0; i < batch.size(); ++i) {
    fed[i] = batch[i].tokens[0];
    step[i].tokens = &fed[i];
  }
  int64_t n = 0;
  while (n < max_steps) {
    pick(step, cache, next);
    ++n;
    std::copy(next.begin(), next.end(), fed.begin());
    if (!on_step(next)) break;
  }
  return n;
}
}  // namespace

int64_t ForwardBackend::decode_greedy(const std::vector<SeqInput>& batch, KvCache& cache, int64_t max_steps,
                                      const GreedyStepFn& on_step) {
  return decode_greedy_stepwise(batch, cache, max_steps, on_step,
                                [this](const auto& b, KvCache& c, std::vector<int32_t>& n) { forward_greedy(b, c, n); });
}

void Model::check_batch(const std::vector<SeqInput>& batch, const KvCache& cache) const {
  for (const SeqInput& s : batch) {
    PERRY_CHECK(s.n_tokens > 0 && s.tokens, "forward: a sequence has no tokens");
    const int64_t len = cache.length(s.slot);
    if (len + s.n_tokens > cache.capacity())
      fail("sequence needs {} positions but the context holds {}: shorten the prompt or raise --ctx (max {})",
           len + s.n_tokens, cache.capacity(), cfg_.max_position_embeddings);
  }
  PERRY_CHECK(!(backend_ && calib_), "calibration runs on the CPU (use --device cpu for perry quantize --smooth)");
}

void Model::forward_greedy(const std::vector<SeqInput>& batch, KvCache& cache, std::vector<int32_t>& next) {
  for (const SeqInput& s : batch)
    PERRY_CHECK(!s.all_logits, "forward_greedy picks one token a sequence: all_logits rows need forward()");
  if (backend_) {
    check_batch(batch, cache);
    backend_->forward_greedy(batch, cache, next);
    return;
  }
  forward(batch, cache, greedy_logits_);
  greedy_tokens(greedy_logits_, batch.size(), next);
}

int64_t Model::decode_greedy(const std::vector<SeqInput>& batch, KvCache& cache, int64_t max_steps,
                             const GreedyStepFn& on_step) {
  PERRY_CHECK(max_steps >= 0, "decode_greedy: max_steps must be >= 0, got {}", max_steps);
  for (const SeqInput& s : batch) {
    PERRY_CHECK(s.slot >= 0 && s.slot < cache.n_slots(), "KV cache slot {} out of range", s.slot);
    PERRY_CHECK(s.n_tokens == 1 && s.tokens && !s.all_logits, "decode_greedy feeds one token a sequence");
    PERRY_CHECK(s.tokens[0] >= 0 && s.tokens[0] < cfg_.vocab_size, "token id {} is outside the vocabulary (0..{})",
                s.tokens[0], cfg_.vocab_size - 1);
    if (cache.length(s.slot) + max_steps > cache.capacity())
      fail("{} decode steps need {} positions but the context holds {}: raise --ctx (max {})", max_steps,
           cache.length(s.slot) + max_steps, cache.capacity(), cfg_.max_position_embeddings);
  }
  if (batch.empty() || max_steps == 0) return 0;
  if (backend_) {
    check_batch(batch, cache);
    return backend_->decode_greedy(batch, cache, max_steps, on_step);
  }
  return decode_greedy_stepwise(batch, cache, max_steps, on_step,
                                [this](const auto& b, KvCache& c, std::vector<int32_t>& n) { forward_greedy(b, c, n); });
}

void Model::forward(const std::vector<SeqInput>& batch, KvCache& cache, std::vector<float>& logits) {
  const io::ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size, hd = c.head_dim;
  const int nh = int(c.num_heads), nkv = int(c.num_kv_heads);
  check_batch(batch, cache);
  int64_t M = 0, out_rows = 0;
  for (const SeqInput& s : batch) {
    M += s.n_tokens;
    out_rows += s.all_logits ? s.n_tokens : 1;
  }
  if (backend_) {
    backend_->forward(batch, cache, logits);
    return;
  }
  prof::set_phase(M == 1 ? prof::Phase::Decode : prof::Phase::Prefill);
  OpCounters& P = ops();
  prof::Scope forward_scope(P.forward);
  // Runs one op under its profile counter (bytes: the weights it streams, for a GB/s column).
  auto op = [](prof::Counter& c, const auto& fn, int64_t bytes = 0) {
    prof::Scope s(c, bytes);
    fn();
  };
  auto lin = [&](prof::Counter& c, const Linear& l, const float* x, float* y) {
    op(c, [&] { l.forward(x, M, y); }, int64_t(l.weight_bytes()));
  };
  Scratch& S = s_;
  auto fit = [](std::vector<float>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
  };
  fit(S.x, M * H); fit(S.xn, M * H); fit(S.q, M * Q); fit(S.k, M * KV); fit(S.v, M * KV);
  fit(S.attn, M * Q); fit(S.o, M * H); fit(S.gate, M * I); fit(S.up, M * I);

  op(P.embed, [&] {
    int64_t off = 0;
    for (const SeqInput& s : batch) {
      kernels::embedding_lookup(embed_.data, embed_.dtype, H, s.tokens, s.n_tokens, S.x.data() + off * H, c.vocab_size);
      off += s.n_tokens;
    }
  });
  const float eps = float(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    op(P.norm, [&] { kernels::rms_norm(S.x.data(), L.in_norm.data(), eps, M, H, S.xn.data()); });
    if (calib_) calib_->attn_in[size_t(l)].observe(S.xn.data(), M, H);
    // q|k|v (and gate|up below) read the same input: one activation quantization, one parallel
    // region in decode (each projection alone is too small to keep both threads streaming).
    op(P.qkv, [&] { Linear::forward_many({{&L.q, S.q.data()}, {&L.k, S.k.data()}, {&L.v, S.v.data()}}, S.xn.data(), M); },
       int64_t(L.q.weight_bytes() + L.k.weight_bytes() + L.v.weight_bytes()));
    if (c.qk_norm) {
      op(P.qk_norm, [&] {
        kernels::rms_norm(S.q.data(), L.q_norm.data(), eps, M * nh, hd, S.q.data());
        kernels::rms_norm(S.k.data(), L.k_norm.data(), eps, M * nkv, hd, S.k.data());
      });
    }
    int64_t off = 0;
    for (const SeqInput& s : batch) {
      const int64_t pos0 = cache.length(s.slot), T = s.n_tokens;
      float* q = S.q.data() + off * Q;
      float* k = S.k.data() + off * KV;
      const float* v = S.v.data() + off * KV;
      op(P.rope, [&] {
        kernels::rope_apply(q, T, nh, Q, pos0, *rope_);
        kernels::rope_apply(k, T, nkv, KV, pos0, *rope_);
      });
      float* kc = cache.keys(s.slot, l);
      float* vc = cache.values(s.slot, l);
      const int64_t cap = cache.capacity();
      op(P.kv_store, [&] {
        for (int64_t t = 0; t < T; ++t)
          for (int h = 0; h < nkv; ++h) {
            std::memcpy(kc + (h * cap + pos0 + t) * hd, k + t * KV + h * hd, size_t(hd) * 4);
            std::memcpy(vc + (h * cap + pos0 + t) * hd, v + t * KV + h * hd, size_t(hd) * 4);
          }
      });
      op(P.attention, [&] {
        kernels::attention_f32(q, T, pos0, nh, nkv, int(hd), kc, vc, cap, scale, S.attn.data() + off * Q);
      });
      off += T;
    }
    lin(P.o, L.o, S.attn.data(), S.o.data());
    op(P.add, [&] { kernels::add_inplace(S.x.data(), S.o.data(), M * H); });
    op(P.norm, [&] { kernels::rms_norm(S.x.data(), L.post_norm.data(), eps, M, H, S.xn.data()); });
    if (calib_) calib_->mlp_in[size_t(l)].observe(S.xn.data(), M, H);
    op(P.gate_up, [&] { Linear::forward_many({{&L.gate, S.gate.data()}, {&L.up, S.up.data()}}, S.xn.data(), M); },
       int64_t(L.gate.weight_bytes() + L.up.weight_bytes()));
    op(P.silu, [&] { kernels::silu_mul(S.gate.data(), S.up.data(), M * I, S.gate.data()); });
    lin(P.down, L.down, S.gate.data(), S.o.data());
    op(P.add, [&] { kernels::add_inplace(S.x.data(), S.o.data(), M * H); });
  }
  for (const SeqInput& s : batch) cache.advance(s.slot, s.n_tokens);
  if (calib_) calib_->tokens += M;

  // Only the rows whose logits are wanted go through the final norm and lm_head.
  fit(S.last, out_rows * H);
  {
    int64_t off = 0, r = 0;
    for (const SeqInput& s : batch) {
      const int64_t first = s.all_logits ? off : off + s.n_tokens - 1;
      const int64_t n = s.all_logits ? s.n_tokens : 1;
      std::memcpy(S.last.data() + r * H, S.x.data() + first * H, size_t(n * H) * 4);
      r += n;
      off += s.n_tokens;
    }
  }
  op(P.norm, [&] { kernels::rms_norm(S.last.data(), final_norm_.data(), eps, out_rows, H, S.last.data()); });
  logits.resize(size_t(out_rows * c.vocab_size));
  op(P.lm_head, [&] { lm_head_.forward(S.last.data(), out_rows, logits.data()); }, int64_t(lm_head_.weight_bytes()));
}

int64_t Model::parameter_count() const {
  int64_t n = embed_.numel() + int64_t(final_norm_.size());
  for (const Layer& L : layers_) {
    for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
      n += l->rows() * l->cols() + int64_t(l->bias().size());
    n += int64_t(L.in_norm.size() + L.post_norm.size() + L.q_norm.size() + L.k_norm.size());
  }
  if (!cfg_.tie_word_embeddings) n += lm_head_.rows() * lm_head_.cols();
  return n;
}

size_t Model::weight_bytes() const {
  size_t b = lm_head_.weight_bytes();
  for (const Layer& L : layers_)
    for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) b += l->weight_bytes();
  return b;
}

std::string Model::kernel_summary() const {
  if (backend_) return backend_->kernel_summary();
  if (layers_.empty()) return "";
  const Layer& L = layers_[0];
  std::string s;
  s += "  attention/mlp linears: M=1 → " + L.gate.kernel_name(1) + ", M=512 → " + L.gate.kernel_name(512) + "\n";
  s += "  lm_head: M=1 → " + lm_head_.kernel_name(1) + ", M=512 → " + lm_head_.kernel_name(512) + "\n";
  return s;
}

std::vector<std::pair<std::string, const Linear*>> Model::named_linears() const {
  std::vector<std::pair<std::string, const Linear*>> out;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const std::string p = layer_prefix(int64_t(l));
    const Layer& L = layers_[l];
    out.push_back({p + "self_attn.q_proj", &L.q});
    out.push_back({p + "self_attn.k_proj", &L.k});
    out.push_back({p + "self_attn.v_proj", &L.v});
    out.push_back({p + "self_attn.o_proj", &L.o});
    out.push_back({p + "mlp.gate_proj", &L.gate});
    out.push_back({p + "mlp.up_proj", &L.up});
    out.push_back({p + "mlp.down_proj", &L.down});
  }
  out.push_back({"lm_head", &lm_head_});
  return out;
}

const std::vector<float>& Model::norm_weight(const std::string& name) const {
  auto it = norms_by_name_.find(name);
  if (it == norms_by_name_.end()) fail("no norm weight '{}'", name);
  return it->second;
}

}  // namespace perry::model
