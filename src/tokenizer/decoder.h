// Decoders (HF "decoder" section): ByteLevel and Sequence. Every supported decoder maps each
// token to bytes independently, which is what lets StreamDecoder emit text token by token and
// still agree exactly with a full decode. The final bytes → text step (invalid UTF-8 → U+FFFD)
// happens once, in Tokenizer::decode / StreamDecoder.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_node.h"

namespace perry::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Appends the bytes that `token` (a vocab or added-token string) stands for.
  virtual void decode_token(std::string_view token, std::string& out) const = 0;
};

// nullptr for JSON null (then tokens are joined with spaces, as HF does).
std::unique_ptr<Decoder> make_decoder(const JsonNode& node);

}  // namespace perry::tokenizer
