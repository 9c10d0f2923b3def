#include "tokenizer/post_processor.h"

#include <string>
#include <unordered_map>

namespace perry::tokenizer {

namespace {

// Wraps the sequence as prefix + ids + suffix when special tokens are requested.
class WrapProcessor final : public PostProcessor {
 public:
  WrapProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<int32_t> prefix_, suffix_;
};

class NoopProcessor final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&, bool) const override {}
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& p : parts_) p->process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

std::unique_ptr<PostProcessor> make_template(const JsonNode& node) {
  // special_tokens: {"name": {"id": "name", "ids": [..], "tokens": [..]}}
  std::unordered_map<std::string, std::vector<int32_t>> specials;
  if (auto st = node.find("special_tokens")) {
    st->require_object();
    for (auto it = st->raw().begin(); it != st->raw().end(); ++it) {
      JsonNode entry(it.value(), st->path() + "[\"" + it.key() + "\"]", node.origin());
      JsonNode ids = entry.at("ids");
      std::vector<int32_t> v;
      for (size_t i = 0; i < ids.size(); ++i) v.push_back(ids[i].token_id());
      specials[it.key()] = std::move(v);
    }
  }
  JsonNode single = node.at("single");
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    JsonNode piece = single[i];
    piece.require_object();
    if (auto sp = piece.find("SpecialToken")) {
      JsonNode name = sp->at("id");
      auto it = specials.find(name.str());
      if (it == specials.end()) {
        name.fail_here("template special token \"{}\" is not in special_tokens", name.str());
      }
      auto& dst = seen_sequence ? suffix : prefix;
      dst.insert(dst.end(), it->second.begin(), it->second.end());
    } else if (auto seq = piece.find("Sequence")) {
      JsonNode id = seq->at("id");
      if (id.str() != "A") id.fail_here("a single-sequence template can only use sequence \"A\"");
      if (seen_sequence) id.fail_here("sequence \"A\" appears twice in the template");
      seen_sequence = true;
    } else {
      piece.fail_here("template piece must be {{\"SpecialToken\": ..}} or {{\"Sequence\": ..}}");
    }
  }
  if (!seen_sequence) single.fail_here("template has no {{\"Sequence\": {{\"id\": \"A\"}}}}");
  return std::make_unique<WrapProcessor>(std::move(prefix), std::move(suffix));
}

// Bert / Roberta: "cls": ["[CLS]", 101], "sep": ["[SEP]", 102].
int32_t pair_id(const JsonNode& pair) {
  if (pair.size() != 2) pair.fail_here("expected [token, id]");
  return pair[1].token_id();
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const JsonNode& node) {
  if (node.is_null()) return nullptr;
  JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  if (type == "TemplateProcessing") return make_template(node);
  if (type == "ByteLevel") return std::make_unique<NoopProcessor>();
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    int32_t cls = pair_id(node.at("cls"));
    int32_t sep = pair_id(node.at("sep"));
    return std::make_unique<WrapProcessor>(std::vector<int32_t>{cls}, std::vector<int32_t>{sep});
  }
  if (type == "Sequence") {
    JsonNode list = node.at("processors");
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      JsonNode item = list[i];
      if (item.is_null()) item.fail_here("expected a post-processor object, got null");
      parts.push_back(make_post_processor(item));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  type_node.fail_here("unsupported post-processor type \"{}\" (supported: TemplateProcessing, "
                      "ByteLevel, BertProcessing, RobertaProcessing, Sequence)", type);
}

}  // namespace perry::tokenizer
