// Post-processors (HF "post_processor" section) for single sequences: TemplateProcessing,
// BertProcessing, RobertaProcessing, ByteLevel (offsets only, so a no-op on ids) and Sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tokenizer/json_node.h"

namespace perry::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

// nullptr for JSON null.
std::unique_ptr<PostProcessor> make_post_processor(const JsonNode& node);

}  // namespace perry::tokenizer
