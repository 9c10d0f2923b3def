// perry info: what a model is, what it needs, and which kernels this machine will run.
#include <algorithm>
#include <cstdio>

#include "cli/common.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"

namespace perry::cli {

Command register_info(CLI::App& root) {
  auto* a = new ModelArgs();
  CLI::App* app = root.add_subcommand("info", "Architecture, parameters, dtypes, memory needed, active CPU kernels");
  add_model_flags(app, a);
  return {app, [a]() -> int {
    const auto& f = cpu_features();
    std::printf("CPU: %s, %d threads\n", f.brand.c_str(), thread_pool().size());
    std::printf("  AVX2 %s  AVX-512 %s  VNNI %s  AVX512-BF16 %s  (kernel ISA: %s)\n", f.avx2 ? "yes" : "no",
                f.avx512f ? "yes" : "no", f.avx512_vnni ? "yes" : "no", f.avx512_bf16 ? "yes" : "no",
                supports_avx512_vnni() ? "avx512-vnni" : supports_avx2() ? "avx2" : "scalar");
    const int dev = std::max(0, parse_device(a->device).value_or(0));
    std::printf("CUDA: %s\n", cuda_report(dev).c_str());
    LoadedModel lm = load_model(*a, false);
    const auto& c = lm.model->config();
    std::printf("model: %s\n", lm.source.c_str());
    std::printf("  architecture %s, %lld layers, hidden %lld, intermediate %lld, heads %lld (kv %lld, head_dim %lld)\n",
                c.architecture_name.c_str(), (long long)c.num_layers, (long long)c.hidden_size,
                (long long)c.intermediate_size, (long long)c.num_heads, (long long)c.num_kv_heads,
                (long long)c.head_dim);
    std::printf("  vocab %lld, max context %lld, rope theta %g%s, tied embeddings %s, qkv bias %s, qk norm %s\n",
                (long long)c.vocab_size, (long long)c.max_position_embeddings, c.rope_theta,
                c.rope_scaling.type == io::RopeType::Llama3 ? " (llama3 scaling)" : "",
                c.tie_word_embeddings ? "yes" : "no", c.attention_bias ? "yes" : "no", c.qk_norm ? "yes" : "no");
    std::printf("  parameters %.2f M, stored dtype %s, mode %s%s\n", double(lm.model->parameter_count()) / 1e6,
                std::string(dtype_name(c.torch_dtype)).c_str(),
                std::string(quant::quant_mode_name(lm.model->mode())).c_str(),
                c.quantization_config.is_null() ? "" : " (perry-quantized checkpoint)");
    const double kv_per_tok = double(c.num_layers * c.kv_dim() * 2 * 4);
    std::printf("  memory: weights read per token %s, KV cache %s per token (%s at context %lld)\n",
                human_bytes(double(lm.model->weight_bytes())).c_str(), human_bytes(kv_per_tok).c_str(),
                human_bytes(kv_per_tok * double(c.max_position_embeddings)).c_str(),
                (long long)c.max_position_embeddings);
    std::printf("runs on: %s\n", lm.model->device_name().c_str());
    std::printf("kernels (mode %s):\n%s", std::string(quant::quant_mode_name(lm.model->mode())).c_str(),
                lm.model->kernel_summary().c_str());
    return 0;
  }};
}

}  // namespace perry::cli
