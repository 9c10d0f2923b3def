// perry export (src/model/hf_export.h): a weight source written as a Hugging Face checkpoint must
// load back through perry's own loader with every tensor bit-identical, sharded or not, and its
// config.json must describe the same model; the streaming safetensors writer must refuse misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/checkpoint.h"
#include "model/hf_export.h"
#include "model/model.h"
#include "model/tensor_names.h"
#include "tiny_checkpoint.h"

using namespace perry;
using namespace perry::model;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / "perry_test_export" / name;
  fs::remove_all(d);
  return d.string();
}

// Every tensor of `src` is in `dir` with the same dtype, shape and bytes, and nothing else is.
void expect_same_tensors(const WeightSource& src, const std::string& dir) {
  auto ckpt = io::Checkpoint::open(dir);
  size_t n = 0;
  for (const auto& spec : expected_tensors(src.config())) {
    if (!src.has(spec.name)) continue;
    ++n;
    const io::TensorView& a = src.get(spec.name);
    ASSERT_TRUE(ckpt.has(spec.name)) << spec.name;
    const io::TensorView& b = ckpt.tensor(spec.name);
    EXPECT_EQ(a.dtype, b.dtype) << spec.name;
    EXPECT_EQ(a.shape, b.shape) << spec.name;
    ASSERT_EQ(a.nbytes, b.nbytes) << spec.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << spec.name << " differs";
    src.release(spec.name);
  }
  EXPECT_EQ(ckpt.tensors().size(), n);
}

void expect_same_config(const io::ModelConfig& a, const io::ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
}

class ExportFamily : public ::testing::TestWithParam<io::Architecture> {};

}  // namespace

TEST_P(ExportFamily, SyntheticRoundTripsBitIdentically) {
  const auto cfg = test_util::tiny_config(GetParam());
  SyntheticWeights src(cfg, "tiny");
  // Sharded: small shards force several files and the index.
  const std::string dir = fresh_dir(std::string("sharded-") + std::string(io::architecture_name(cfg.arch)));
  HfExportOptions o;
  o.max_shard_bytes = 24 * 1024;
  int64_t last_done = 0, total = 0, files = 0;
  o.progress = [&](int64_t d, int64_t t, const std::string&) { EXPECT_EQ(d, last_done + 1); last_done = d; total = t; };
  o.file_done = [&](const std::string& p, uint64_t) { ++files; EXPECT_TRUE(fs::exists(p)) << p; };
  const HfExportResult r = export_hf_checkpoint(src, dir, o);
  EXPECT_GT(r.files.size(), 2u);
  EXPECT_EQ(int64_t(r.files.size()), files);
  EXPECT_EQ(r.tensors, total);
  EXPECT_EQ(last_done, total);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", r.files.size());
  EXPECT_EQ(fs::path(r.files[0]).filename().string(), first);
  const auto index = nlohmann::json::parse(read_text_file(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), r.total_bytes);
  EXPECT_EQ(int64_t(index["weight_map"].size()), r.tensors);
  // A shard may exceed the limit only when it holds a single tensor larger than the limit.
  for (const auto& f : r.files) {
    io::SafetensorsFile sf(f);
    size_t bytes = 0;
    for (const auto& [n, t] : sf.tensors()) bytes += t.nbytes;
    EXPECT_TRUE(bytes <= o.max_shard_bytes || sf.tensors().size() == 1) << f;
    EXPECT_EQ(sf.metadata().at("format"), "pt");
  }
  SyntheticWeights again(cfg, "tiny");  // a fresh source: the bytes are regenerated, not reused
  expect_same_tensors(again, dir);
  const auto j = nlohmann::json::parse(read_text_file(dir + "/config.json"));
  EXPECT_EQ(j["architectures"][0], std::string(io::architecture_name(cfg.arch)));
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  expect_same_config(cfg, io::Checkpoint::open(dir).config());
  EXPECT_TRUE(fs::exists(dir + "/generation_config.json"));

  // One file, written over the sharded export: the stale shards and index must go, or loaders
  // would read a mix.
  HfExportOptions one;
  one.max_shard_bytes = 0;
  const HfExportResult r1 = export_hf_checkpoint(src, dir, one);
  ASSERT_EQ(r1.files.size(), 1u);
  EXPECT_EQ(r1.total_bytes, r.total_bytes);
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  for (const auto& f : r.files) EXPECT_FALSE(fs::exists(f)) << f;
  expect_same_tensors(again, dir);

  // perry's loader accepts the export as a model and runs it.
  LoadOptions lo;
  lo.dir = dir;
  auto m = Model::load(lo);
  auto cache = m->make_cache(8, 1);
  std::vector<float> logits;
  const std::vector<int32_t> toks = {1, 5, 9, 3};
  m->forward({{0, toks.data(), 4, false}}, cache, logits);
  ASSERT_EQ(int64_t(logits.size()), cfg.vocab_size);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

INSTANTIATE_TEST_SUITE_P(Families, ExportFamily,
                         ::testing::Values(io::Architecture::Llama, io::Architecture::Qwen2, io::Architecture::Qwen3));

TEST(Export, CheckpointSourceKeepsDtypeAndLogits) {
  // An F32 checkpoint re-exported keeps F32, and both load to the same logits.
  const auto cfg = test_util::tiny_config(io::Architecture::Qwen3);
  const std::string in = test_util::write_tiny_checkpoint("export-src-f32", cfg, 3, DType::F32);
  auto ckpt = std::make_shared<const io::Checkpoint>(io::Checkpoint::open(in));
  CheckpointWeights src(ckpt);
  const std::string out = fresh_dir("from-checkpoint");
  export_hf_checkpoint(src, out);
  expect_same_tensors(src, out);
  EXPECT_EQ(io::Checkpoint::open(out).tensor("model.embed_tokens.weight").dtype, DType::F32);
  std::vector<float> la, lb;
  const std::vector<int32_t> toks = {4, 8, 15, 16, 23, 42};
  for (auto [d, l] : {std::pair{in, &la}, std::pair{out, &lb}}) {
    LoadOptions lo;
    lo.dir = d;
    auto m = Model::load(lo);
    auto cache = m->make_cache(8, 1);
    m->forward({{0, toks.data(), int64_t(toks.size()), false}}, cache, *l);
  }
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
}

TEST(Export, StreamWriterRefusesMisuse) {
  const std::string dir = fresh_dir("stream");
  fs::create_directories(dir);
  const std::string path = dir + "/t.safetensors";
  const std::vector<uint16_t> a(6, 0x3f80), b(4, 0x4000);
  using Spec = io::SafetensorsStreamWriter::Spec;
  {
    io::SafetensorsStreamWriter w(path, {Spec{"a", DType::BF16, {2, 3}}, Spec{"b", DType::BF16, {4}}});
    EXPECT_THROW(w.write_next("b", b.data(), 8), Error);       // out of order
    EXPECT_THROW(w.write_next("a", a.data(), 10), Error);      // wrong size
    w.write_next("a", a.data(), 12);
    EXPECT_THROW(w.finish(), Error);                           // "b" missing
  }
  EXPECT_FALSE(fs::exists(path)) << "an unfinished file must be removed";
  {
    io::SafetensorsStreamWriter w(path, {Spec{"a", DType::BF16, {2, 3}}, Spec{"b", DType::BF16, {4}}},
                                  {{"format", "pt"}});
    w.write_next("a", a.data(), 12);
    w.write_next("b", b.data(), 8);
    w.finish();
    EXPECT_EQ(w.data_bytes(), 20u);
  }
  io::SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors().at("b").shape, std::vector<int64_t>({4}));
  EXPECT_EQ(std::memcmp(f.tensors().at("b").data, b.data(), 8), 0);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  // The same bytes as the buffered writer, which shares the header code.
  io::SafetensorsWriter bw;
  bw.add("a", DType::BF16, {2, 3}, a.data(), 12);
  bw.add("b", DType::BF16, {4}, b.data(), 8);
  bw.set_metadata("format", "pt");
  bw.write(dir + "/u.safetensors");
  EXPECT_EQ(read_text_file(path), read_text_file(dir + "/u.safetensors"));
}

TEST(Export, RefusesMissingTensors) {
  auto cfg = test_util::tiny_config(io::Architecture::Llama);
  const std::string in = test_util::write_tiny_checkpoint("export-missing", cfg, 1, [](TensorSpec& s) {
    return s.name != "model.layers.1.mlp.up_proj.weight";
  });
  // Checkpoint::open does not check names; the exporter must.
  auto ckpt = std::make_shared<const io::Checkpoint>(io::Checkpoint::open(in));
  CheckpointWeights src(ckpt);
  try {
    export_hf_checkpoint(src, fresh_dir("missing"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
}
