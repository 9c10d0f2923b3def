// Normalizers (HF tokenizers "normalizer" section): Unicode normal forms via utf8proc, and
// Sequence. Applied to each text segment that is not an added token.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_node.h"

namespace perry::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view text) const = 0;  // text is valid UTF-8
};

// Builds the normalizer described at `node`; nullptr for JSON null.
std::unique_ptr<Normalizer> make_normalizer(const JsonNode& node);

}  // namespace perry::tokenizer
