// Shared by the server tests: the tiny trained model and the single-sequence oracle
// (runtime::generate on a separate Model instance, so it never shares state with the scheduler).
#pragma once
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace perry::server::test_util {

inline std::string model_dir() {
  const char* src = std::getenv("PERRY_SOURCE_DIR");
  return std::string(src ? src : PERRY_SOURCE_DIR) + "/models/perry-llama-8m";
}

struct LoadedTiny {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

inline LoadedTiny load_tiny(std::optional<quant::QuantMode> quant = std::nullopt) {
  model::LoadOptions o;
  o.dir = model_dir();
  o.quant = quant;
  LoadedTiny t;
  t.model = model::Model::load(o);
  t.tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_file(o.dir + "/tokenizer.json"));
  return t;
}

// The eos ids a plain completion stops on: generation_config.json + config.json.
inline std::vector<int32_t> completion_eos(const model::Model& m) {
  std::vector<int32_t> ids = io::Checkpoint::open(model_dir()).generation_defaults().eos_token_ids;
  for (int32_t e : m.config().eos_token_ids) ids.push_back(e);
  return ids;
}

// Chat adds the template's end-of-turn token.
inline std::vector<int32_t> chat_eos(const model::Model& m, const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ids = completion_eos(m);
  auto cfg = tokenizer::load_chat_template_config(model_dir());
  if (auto id = tok.token_id(cfg.eos_token)) ids.push_back(*id);
  return ids;
}

inline std::vector<int32_t> chat_prompt(const tokenizer::Tokenizer& tok, const std::vector<tokenizer::ChatMessage>& msgs) {
  auto cfg = tokenizer::load_chat_template_config(model_dir());
  tokenizer::ChatTemplate t(cfg.source);
  return tok.encode(t.render(msgs, true, {{"bos_token", cfg.bos_token}, {"eos_token", cfg.eos_token}}), false);
}

struct OracleOut {
  std::string text;
  runtime::GenerateStats st;
};

inline OracleOut oracle(LoadedTiny& t, const std::vector<int32_t>& prompt, int64_t max_tokens, std::vector<int32_t> eos,
                        std::vector<std::string> stops = {}, int64_t ctx = 512) {
  model::KvCache cache = t.model->make_cache(ctx, 1);
  runtime::GenerateOptions go;
  go.max_new_tokens = max_tokens;
  go.eos_ids = std::move(eos);
  go.stop_strings = std::move(stops);
  OracleOut out;
  out.st = runtime::generate(*t.model, *t.tok, cache, 0, prompt, go, [&](const std::string& s) {
    out.text += s;
    return true;
  });
  return out;
}

}  // namespace perry::server::test_util
