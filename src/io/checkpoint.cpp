#include "io/checkpoint.h"

#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/mapped_file.h"

namespace perry::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json parse_json_file(const std::string& path) {
  std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

}  // namespace

GenerationDefaults parse_generation_config(const std::string& text, const std::string& origin) {
  GenerationDefaults g;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object()) fail("{}: must be a JSON object", origin);
  auto num = [&](const char* k) -> std::optional<double> {
    if (!j.contains(k) || j[k].is_null()) return std::nullopt;
    if (!j[k].is_number()) fail("{}: \"{}\" must be a number", origin, k);
    return j[k].get<double>();
  };
  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) g.eos_token_ids.push_back(e.get<int32_t>());
    else if (e.is_array())
      for (const json& x : e) {
        if (!x.is_number_integer()) fail("{}: eos_token_id must hold integers", origin);
        g.eos_token_ids.push_back(x.get<int32_t>());
      }
    else if (!e.is_null()) fail("{}: eos_token_id must be an id or a list of ids", origin);
  }
  g.temperature = num("temperature");
  g.top_p = num("top_p");
  g.min_p = num("min_p");
  g.repetition_penalty = num("repetition_penalty");
  if (auto k = num("top_k")) g.top_k = int64_t(*k);
  if (j.contains("do_sample") && j["do_sample"].is_boolean()) g.do_sample = j["do_sample"].get<bool>();
  return g;
}

Checkpoint Checkpoint::open(const std::string& dir_in) {
  Checkpoint c;
  c.dir_ = dir_in;
  while (c.dir_.size() > 1 && c.dir_.back() == '/') c.dir_.pop_back();
  const std::string& dir = c.dir_;
  if (!fs::exists(dir)) fail("model directory {} does not exist", dir);
  if (!fs::is_directory(dir)) fail("{} is not a directory (give the checkpoint directory that holds config.json)", dir);
  if (!fs::exists(dir + "/config.json")) fail("{}: no config.json — is this a Hugging Face checkpoint directory?", dir);
  c.config_ = load_model_config(dir + "/config.json");

  if (fs::exists(dir + "/generation_config.json")) {
    c.generation_ = parse_generation_config(read_text_file(dir + "/generation_config.json"),
                                            dir + "/generation_config.json");
  }
  if (fs::exists(dir + "/tokenizer_config.json")) {
    c.tokenizer_config_ = parse_json_file(dir + "/tokenizer_config.json");
    if (!c.tokenizer_config_.is_object()) fail("{}/tokenizer_config.json: must be a JSON object", dir);
  }
  if (fs::exists(dir + "/chat_template.jinja")) c.chat_template_file_ = dir + "/chat_template.jinja";

  std::vector<std::string> shards;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(dir + "/model.safetensors")) {
    shards.push_back(dir + "/model.safetensors");
  } else if (fs::exists(index)) {
    json idx = parse_json_file(index);
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("{}: missing \"weight_map\" object", index);
    std::set<std::string> files;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail("{}: weight_map values must be file names", index);
      std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
        fail("{}: shard name \"{}\" must be a plain file name in the checkpoint directory", index, f);
      files.insert(f);
    }
    for (const auto& f : files) shards.push_back(dir + "/" + f);
    // Every tensor named in the index must come from the shard it names (checked below).
    for (const auto& s : shards) {
      c.files_.push_back(std::make_unique<SafetensorsFile>(s));
      for (const auto& [name, t] : c.files_.back()->tensors()) {
        if (!c.tensors_.emplace(name, t).second) fail("{}: tensor '{}' appears in more than one shard", index, name);
      }
    }
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it)
      if (!c.tensors_.count(it.key()))
        fail("{}: tensor '{}' is listed in the index but missing from shard {}", index, it.key(),
             it.value().get<std::string>());
    return c;
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json (perry reads safetensors checkpoints)", dir);
  }
  for (const auto& s : shards) {
    c.files_.push_back(std::make_unique<SafetensorsFile>(s));
    for (const auto& [name, t] : c.files_.back()->tensors()) c.tensors_.emplace(name, t);
  }
  return c;
}

const TensorView& Checkpoint::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: checkpoint is missing tensor '{}'", dir_, name);
  return it->second;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [_, t] : tensors_) n += t.nbytes;
  return n;
}

std::optional<std::string> Checkpoint::chat_template() const {
  if (tokenizer_config_.contains("chat_template")) {
    const json& t = tokenizer_config_["chat_template"];
    if (t.is_string()) return t.get<std::string>();
    if (t.is_array())  // list of {name, template}: take "default"
      for (const json& e : t)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          return e["template"].get<std::string>();
  }
  if (!chat_template_file_.empty()) return read_text_file(chat_template_file_);
  return std::nullopt;
}

}  // namespace perry::io
