#include "model/hf_export.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/tensor_names.h"

namespace perry::model {

namespace fs = std::filesystem;
using nlohmann::json;

json hf_config_json(const io::ModelConfig& cfg) {
  json j = io::model_config_to_json(cfg);
  // perry only implements SwiGLU with silu; transformers' default is the same, but a config that
  // says so is unambiguous for every reader.
  j["hidden_act"] = "silu";
  j["use_cache"] = true;
  if (cfg.arch != io::Architecture::Llama) j["use_sliding_window"] = false;
  if (cfg.arch == io::Architecture::Llama) j["mlp_bias"] = false;
  return j;
}

namespace {

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  f.close();
  if (!f) fail("failed writing {}", p.string());
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

HfExportResult export_hf_checkpoint(const WeightSource& src, const std::string& out_dir, const HfExportOptions& opts) {
  const io::ModelConfig& cfg = src.config();
  PERRY_CHECK(cfg.quantization_config.is_null(),
              "export writes float checkpoints; {} is quantized (its tensors are not the HF float ones)", src.describe());
  // The tensor list: every tensor the architecture has (optional ones only when present).
  std::vector<io::SafetensorsStreamWriter::Spec> specs;
  for (const TensorSpec& t : expected_tensors(cfg)) {
    if (!src.has(t.name)) {
      if (t.required) fail("{}: missing tensor '{}'", src.describe(), t.name);
      continue;
    }
    specs.push_back({t.name, src.dtype(t.name), t.shape});
  }
  // Greedy sharding in tensor order (transformers' save_pretrained shards the same way).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t b = io::SafetensorsStreamWriter::spec_bytes(specs[i]);
    if (opts.max_shard_bytes && !shards.back().empty() && in_shard + b > opts.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }

  fs::create_directories(out_dir);
  // Stale weights from an earlier export would shadow or contradict the new ones.
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("model", 0) == 0 && (n.ends_with(".safetensors") || n == "model.safetensors.index.json"))
      fs::remove(e.path());
  }

  HfExportResult res;
  const int64_t total = int64_t(specs.size());
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    const std::string path = (fs::path(out_dir) / name).string();
    std::vector<io::SafetensorsStreamWriter::Spec> part;
    for (size_t i : shards[s]) part.push_back(specs[i]);
    io::SafetensorsStreamWriter w(path, part, {{"format", "pt"}});
    for (const auto& sp : part) {
      const io::TensorView& t = src.get(sp.name);
      PERRY_CHECK(t.dtype == sp.dtype && t.shape == sp.shape, "{}: tensor '{}' is {} {}, expected {} {}",
                  src.describe(), sp.name, dtype_name(t.dtype), t.shape_str(), dtype_name(sp.dtype),
                  io::TensorView{sp.name, sp.dtype, sp.shape}.shape_str());
      w.write_next(sp.name, t.data, t.nbytes);
      src.release(sp.name);
      weight_map[sp.name] = name;
      ++res.tensors;
      if (opts.progress) opts.progress(res.tensors, total, sp.name);
    }
    w.finish();
    res.files.push_back(path);
    res.total_bytes += w.data_bytes();
    if (opts.file_done) opts.file_done(path, w.data_bytes());
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", res.total_bytes}}}, {"weight_map", weight_map}};
    write_text(fs::path(out_dir) / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_text(fs::path(out_dir) / "config.json", hf_config_json(cfg).dump(2) + "\n");
  json gen = {{"do_sample", false}};
  if (cfg.bos_token_ids.size() == 1) gen["bos_token_id"] = cfg.bos_token_ids[0];
  if (cfg.eos_token_ids.size() == 1) gen["eos_token_id"] = cfg.eos_token_ids[0];
  else if (!cfg.eos_token_ids.empty()) gen["eos_token_id"] = cfg.eos_token_ids;
  write_text(fs::path(out_dir) / "generation_config.json", gen.dump(2) + "\n");
  return res;
}

}  // namespace perry::model
