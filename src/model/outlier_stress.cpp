#include "model/outlier_stress.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/tensor_names.h"

namespace perry::model {

namespace fs = std::filesystem;

namespace {

// Scales element (row, col) of a 2-D bf16/f16/f32 tensor by a power of two, exactly.
void scale_column(std::vector<uint8_t>& bytes, DType dt, int64_t N, int64_t K, int64_t col, float f) {
  for (int64_t i = 0; i < N; ++i) {
    const size_t idx = size_t(i * K + col);
    if (dt == DType::BF16) {
      auto* p = reinterpret_cast<uint16_t*>(bytes.data());
      p[idx] = f32_to_bf16(bf16_to_f32(p[idx]) * f);
    } else if (dt == DType::F16) {
      auto* p = reinterpret_cast<uint16_t*>(bytes.data());
      p[idx] = f32_to_f16(f16_to_f32(p[idx]) * f);
    } else {
      reinterpret_cast<float*>(bytes.data())[idx] *= f;
    }
  }
}

}  // namespace

void write_outlier_stressed(const std::string& in, const std::string& out, int channels, unsigned seed) {
    auto ck = io::Checkpoint::open(in);
    const auto& c = ck.config();
    PERRY_CHECK(c.quantization_config.is_null(), "{} is quantized; start from a float checkpoint", in);
    std::map<std::string, std::vector<uint8_t>> data;
    for (const auto& [name, t] : ck.tensors()) data[name].assign(t.data, t.data + t.nbytes);
    std::mt19937 rng(seed);
    const float factors[] = {16.0f, 32.0f, 64.0f};
    std::fprintf(stderr, "stressing %d channels per norm in %lld layers\n", channels, (long long)c.num_layers);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = model::layer_prefix(l);
      struct Group { const char* norm; std::vector<const char*> linears; };
      for (const Group& g : {Group{"input_layernorm.weight", {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
                             Group{"post_attention_layernorm.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}}}) {
        std::set<int64_t> chosen;
        while (int(chosen.size()) < std::min<int64_t>(channels, c.hidden_size)) chosen.insert(int64_t(rng() % uint64_t(c.hidden_size)));
        for (int64_t ch : chosen) {
          const float f = factors[rng() % 3];
          const auto& nt = ck.tensor(p + g.norm);
          scale_column(data[nt.name], nt.dtype, 1, c.hidden_size, ch, f);
          for (const char* ln : g.linears) {
            const auto& wt = ck.tensor(p + ln);
            scale_column(data[wt.name], wt.dtype, wt.shape[0], wt.shape[1], ch, 1.0f / f);
          }
        }
      }
    }
    fs::create_directories(out);
    io::SafetensorsWriter w;
    for (const auto& [name, t] : ck.tensors()) w.add(name, t.dtype, t.shape, data[name].data(), data[name].size());
    w.set_metadata("format", "pt");
    w.write(out + "/model.safetensors");
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      if (fs::exists(in + "/" + f)) fs::copy_file(in + "/" + f, out + "/" + f, fs::copy_options::overwrite_existing);
}

}  // namespace perry::model
