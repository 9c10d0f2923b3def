// UTF-8 helpers shared by the tokenizer stages: validation (with the byte offset of the first
// error), the exact lossy conversion Rust's String::from_utf8_lossy performs (HF decode relies
// on it, so perry must replace invalid bytes the same way), and the character classes that HF's
// added-token matching uses (Rust regex \s and \w).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace perry::tokenizer {

// Offset of the first byte that does not start a valid UTF-8 sequence, or nullopt if `s` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// Result of inspecting the sequence that starts at s[0]: `len` bytes form a valid character
// (kValid), a maximal invalid subpart (kInvalid, replaced by one U+FFFD), or a prefix that may
// still become valid when more bytes arrive (kIncomplete; len = bytes available).
enum class Utf8Status { kValid, kInvalid, kIncomplete };
struct Utf8Step {
  Utf8Status status;
  size_t len;
};
Utf8Step utf8_step(std::string_view s);

// Appends `bytes` to `out`, replacing each maximal invalid subpart with U+FFFD (as
// from_utf8_lossy does; an incomplete tail is one maximal subpart).
void append_utf8_lossy(std::string_view bytes, std::string& out);

// Decodes the character at s[pos] (s must be valid UTF-8); sets *len to its byte length.
char32_t decode_utf8_at(std::string_view s, size_t pos, size_t* len);
void append_utf8(char32_t cp, std::string& out);

// Unicode White_Space property (Rust's char::is_whitespace, regex \s).
bool is_unicode_whitespace(char32_t cp);
// Rust regex \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp);

}  // namespace perry::tokenizer
