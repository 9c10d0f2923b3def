// PCRE2 wrapper for the pre-tokenizer patterns. HF compiles them with Oniguruma; PCRE2 with
// UTF + UCP gives the same \p{L}/\p{N}/\s classes, possessive quantifiers and lookahead.
// Matching is thread-safe (match data and JIT stack are per thread).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace perry::tokenizer {

class Regex {
 public:
  // Throws perry::Error with PCRE2's message and the offset in the pattern; `literal` matches
  // the pattern text verbatim (HF's Split {"String": ...}).
  Regex(const std::string& pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All matches as [start, end) byte ranges, with the iteration rules of the Rust onig crate
  // that HF uses: after an empty match the search moves one character on, and an empty match
  // right where the previous match ended is not reported. `text` must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace perry::tokenizer
