// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json, agreeing exactly with the
// HF `tokenizers` library. Built as HF's pipeline of components configured by the file:
//   added tokens → normalizer → pre-tokenizer → BPE model → post-processor   (encode)
//   ids → tokens → decoder → UTF-8 (lossy)                                   (decode)
// Llama-3 and Qwen differ only in the data of their tokenizer.json, never in code.
// Thread-safety: a Tokenizer is immutable after loading except for an internal, locked cache;
// encode/decode may be called from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace perry::tokenizer {

class Tokenizer {
 public:
  // Throw perry::Error naming the file (origin) and the JSON path of any problem.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  static Tokenizer from_json(std::string_view json_text, const std::string& origin_for_errors);

  // Invalid UTF-8 input → perry::Error with the byte offset of the first bad byte.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Unknown ids are skipped (as HF does); invalid UTF-8 in the result becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  std::string token_text(int32_t id) const;            // the vocab string (e.g. "Ġthe")
  std::optional<int32_t> token_id(std::string_view token_text) const;  // vocab or added token
  int32_t vocab_size() const;                           // max id + 1 over vocab and added tokens
  bool is_special(int32_t id) const;                    // added token with special=true

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for generation: push() returns only complete UTF-8 text; bytes of a
// character split across tokens are held back until a later token completes them. The
// concatenation of all push() results and flush() equals Tokenizer::decode of the same ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = true);
  std::string push(int32_t id);   // complete UTF-8 text made available by this token
  std::string flush();            // whatever remains (invalid tail bytes → U+FFFD)

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;  // bytes not yet emitted (an incomplete UTF-8 sequence)
};

}  // namespace perry::tokenizer
