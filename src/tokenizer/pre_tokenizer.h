// Pre-tokenizers (HF "pre_tokenizer" section): Split (regex or literal, with HF's delimiter
// behaviors and invert), ByteLevel (optional prefix space and GPT-2 regex, then the byte→char
// mapping), and Sequence. Each stage maps a list of pieces to a finer list of pieces.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_node.h"

namespace perry::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenized form; empty pieces are dropped, as in HF.
  virtual void pre_tokenize(std::vector<std::string>& pieces) const = 0;
};

// nullptr for JSON null.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonNode& node);

// The GPT-2 byte→char table (bytes that are printable map to themselves, the others to
// U+0100 + n). Used by the ByteLevel pre-tokenizer and decoder.
const std::string& byte_level_char(unsigned char b);          // UTF-8 of the char for byte b
int byte_level_byte(char32_t cp);                             // inverse, -1 if not in the table

}  // namespace perry::tokenizer
