// The decoder-only transformer shared by Llama, Qwen2 and Qwen3 (see tensor_names.cpp for how
// the families differ). forward() takes several sequences at once: all their new tokens go
// through the linear layers together (prefill of one prompt, or one token each of many
// sequences in batched decode), attention runs per sequence against its KV-cache slot.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "kernels/cpu/ops.h"
#include "model/calibration.h"
#include "model/kv_cache.h"
#include "model/linear.h"
#include "model/weight_source.h"
#include "quant/quant.h"

namespace perry::model {

struct LoadOptions {
  std::string dir;                  // HF checkpoint directory (or a perry-quantized one)
  std::string synthetic;            // preset name instead of dir (random weights)
  std::optional<quant::QuantMode> quant;  // convert at load; default: float, or the file's mode
  bool quant_lm_head = true;        // lm_head follows --quant (false keeps it float)
  // SmoothQuant factors to fold into norms and q/k/v, gate/up weights before quantizing.
  const SmoothingPlan* smoothing = nullptr;
  // false: quantized layers keep only the canonical form (a device backend uploads it; the CPU
  // kernels' packed copy is built on a first CPU forward, if any) — halves host memory and load time.
  bool pack_for_cpu = true;
  // progress(done, total, what) while converting/loading layers.
  std::function<void(int64_t, int64_t, const std::string&)> progress;
};

struct SeqInput {
  int64_t slot = 0;              // KV-cache slot of the sequence
  const int32_t* tokens = nullptr;
  int64_t n_tokens = 0;
  bool all_logits = false;       // logits for every new token (perplexity) or only the last
};

// The greedy pick from one row of logits: the first index of the largest non-NaN value (torch.argmax
// also takes the first maximum); a row of only NaN gives 0. The one rule of every greedy path:
// runtime::Sampler at temperature 0, Model::forward_greedy, cuda::argmax_rows.
int32_t greedy_token(const float* logits, int64_t vocab);
// greedy_token of each of the rows of logits (row-major, logits.size() / rows wide) into next.
void greedy_tokens(const std::vector<float>& logits, size_t rows, std::vector<int32_t>& next);

// Sees each greedy decode step's tokens (one a sequence, in batch order); returns false to stop.
using GreedyStepFn = std::function<bool(const std::vector<int32_t>& tokens)>;

// A device that runs forward() instead of the CPU kernels (the CUDA backend). Set on a loaded
// Model; the model keeps its weights, config and checks, the backend does the arithmetic.
class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;
  virtual void forward(const std::vector<SeqInput>& batch, KvCache& cache, std::vector<float>& logits) = 0;
  // forward(), then greedy_token() of each sequence's row into next (one row a sequence: every
  // all_logits is false). This default picks on the host; a backend that can pick where the logits
  // are overrides it (CUDA: an argmax kernel, so 4 bytes a sequence cross PCIe instead of vocab·4
  // and the host scans nothing).
  virtual void forward_greedy(const std::vector<SeqInput>& batch, KvCache& cache, std::vector<int32_t>& next);
  // Model::decode_greedy's work, its arguments checked. This default runs forward_greedy step by
  // step; a backend that can feed the picked tokens back where they are picked overrides it (CUDA:
  // each step is enqueued before the previous one's tokens reach the host, so the GPU does not
  // wait for the host between steps).
  virtual int64_t decode_greedy(const std::vector<SeqInput>& batch, KvCache& cache, int64_t max_steps,
                                const GreedyStepFn& on_step);
  virtual std::string name() const = 0;                 // e.g. "cuda:0 (NVIDIA H200)"
  virtual std::string kernel_summary() const = 0;       // kernels per layer kind, for perry info
  virtual int64_t preferred_prefill_chunk() const = 0;  // tokens per forward when feeding a long prompt
  virtual void synchronize() = 0;                       // waits for queued work (timing)
};

// The weights of one decoder layer (float norms; linears in the model's mode).
struct DecoderLayer {
  std::vector<float> in_norm, post_norm, q_norm, k_norm;
  Linear q, k, v, o, gate, up, down;
};

class Model {
 public:
  static std::unique_ptr<Model> load(const LoadOptions& opts);

  const io::ModelConfig& config() const { return cfg_; }
  const WeightSource& weights() const { return *src_; }
  quant::QuantMode mode() const { return mode_; }
  KvCache make_cache(int64_t capacity, int64_t n_slots) const;

  // Appends the sequences' tokens to their slots and writes logits row-major into `logits`
  // (resized): for each sequence in order, n_tokens rows if all_logits else 1 row, vocab wide.
  void forward(const std::vector<SeqInput>& batch, KvCache& cache, std::vector<float>& logits);
  // forward() with each sequence's greedy next token (greedy_token of its logits row) in next[i]
  // instead of the logits: how greedy decoding runs (perry run / bench, the generator at --temp 0
  // without a repetition penalty), since a device backend then returns token ids instead of
  // vocabulary-wide rows. Every all_logits must be false.
  void forward_greedy(const std::vector<SeqInput>& batch, KvCache& cache, std::vector<int32_t>& next);
  // Greedy decoding of a run of steps: step 1 feeds batch's tokens (one a sequence), every later
  // step the tokens the step before picked, up to max_steps steps (each sequence's slot must have
  // room for them). on_step sees each step's tokens in order, with the cache holding exactly the
  // steps so far, and returns false to stop. Returns the steps taken. The same tokens as
  // forward_greedy step by step — but a device backend need not wait for the host between steps.
  int64_t decode_greedy(const std::vector<SeqInput>& batch, KvCache& cache, int64_t max_steps,
                        const GreedyStepFn& on_step);

  // Runs forward() on a device from now on (nullptr: back to the CPU kernels).
  void set_backend(std::unique_ptr<ForwardBackend> b) { backend_ = std::move(b); }
  ForwardBackend* backend() const { return backend_.get(); }
  std::string device_name() const { return backend_ ? backend_->name() : "cpu"; }
  // Tokens per forward when feeding a long prompt (the CPU keeps its caches warm with 512; a GPU
  // wants the whole prompt at once).
  int64_t preferred_prefill_chunk() const { return backend_ ? backend_->preferred_prefill_chunk() : 512; }

  // The weights, for device backends that upload them.
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  const io::TensorView& embedding() const { return embed_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const kernels::RopeTable& rope() const { return *rope_; }

  // While set, forward() records per-channel activation absmax at the linear-group inputs.
  void set_calibration(CalibrationStats* stats) {
    calib_ = stats;
    if (stats) {
      stats->attn_in.resize(size_t(cfg_.num_layers));
      stats->mlp_in.resize(size_t(cfg_.num_layers));
    }
  }
  bool smoothed() const { return smoothed_; }

  int64_t parameter_count() const;
  size_t weight_bytes() const;          // bytes streamed per decode step (all linears + embedding row)
  std::string kernel_summary() const;   // which kernel each kind of layer uses at M=1 and M=512
  const Linear& lm_head() const { return lm_head_; }

  // For perry quantize: every linear with its checkpoint name.
  std::vector<std::pair<std::string, const Linear*>> named_linears() const;
  const std::vector<float>& norm_weight(const std::string& name) const;

 private:
  using Layer = DecoderLayer;
  struct Scratch {
    std::vector<float> x, xn, q, k, v, attn, o, gate, up, hidden, last;
  };
  Model() = default;
  void check_batch(const std::vector<SeqInput>& batch, const KvCache& cache) const;
  void load_layers(const LoadOptions& opts);
  Linear make_linear(const std::string& base, const LoadOptions& opts, bool is_lm_head,
                     const std::vector<float>* col_scale = nullptr);

  io::ModelConfig cfg_;
  std::shared_ptr<WeightSource> src_;
  quant::QuantMode mode_ = quant::QuantMode::BF16;
  io::TensorView embed_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  Linear lm_head_;
  std::unique_ptr<kernels::RopeTable> rope_;
  std::map<std::string, std::vector<float>> norms_by_name_;
  Scratch s_;
  std::vector<float> greedy_logits_;  // forward_greedy on the CPU
  CalibrationStats* calib_ = nullptr;
  bool smoothed_ = false;
  std::vector<std::vector<float>> owned_;  // smoothed float weights kept alive for float modes
  std::unique_ptr<ForwardBackend> backend_;
};

}  // namespace perry::model
