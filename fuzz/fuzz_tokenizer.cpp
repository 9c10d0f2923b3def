// libFuzzer target for the tokenizer. Each input is used twice:
//  1. as a tokenizer.json given to Tokenizer::from_json — must load or throw perry::Error;
//  2. as text for two small fixed tokenizers — encode must succeed or throw perry::Error (only
//     for invalid UTF-8), decode(encode(x)) must give x back where no normalizer is involved,
//     and streaming decode must equal full decode and never emit invalid UTF-8.
// Anything else (crash, sanitizer report, other exception, broken invariant) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using perry::tokenizer::StreamDecoder;
using perry::tokenizer::Tokenizer;

namespace {

// Byte-level vocab with all 256 bytes (so every text round-trips), some merges, and added
// tokens (with lstrip / rstrip / single_word / normalized on the Qwen-like one). `qwen_like` adds NFC and the Qwen Split regex.
std::string small_tokenizer_json(bool qwen_like) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[perry::tokenizer::byte_level_char(static_cast<unsigned char>(b))] = b;
  const char* merges[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "Ġ"},
                             {"ĠĠ", "ĠĠ"}, {"e", "r"}, {"Ã", "©"}, {"1", "2"}, {"Ċ", "Ċ"}};
  json merge_list = json::array();
  int next = 256;
  for (auto& m : merges) {
    std::string joined = std::string(m[0]) + m[1];
    if (!vocab.contains(joined)) vocab[joined] = next++;
    merge_list.push_back({m[0], m[1]});
  }
  auto added = [&](const char* content, bool special, bool lstrip, bool rstrip, bool single,
                   bool normalized) {
    return json{{"id", next++}, {"content", content}, {"special", special}, {"lstrip", lstrip},
                {"rstrip", rstrip}, {"single_word", single}, {"normalized", normalized}};
  };
  // lstrip / rstrip swallow whitespace, so only the tokenizer that is not checked for exact
  // round trips gets them.
  json added_tokens = json::array({added("<|end|>", true, false, false, false, false),
                                   added("word", false, false, false, true, true),
                                   added("\xE6\x97\xA5\xE6\x9C\xAC", false, false, false, false, true)});
  if (qwen_like) {
    // All of "été"'s chars are in the byte-level table, so (as in HF) the ByteLevel decoder
    // maps them to single bytes and the text does not round-trip: only on this tokenizer.
    added_tokens.push_back(added("\xC3\xA9t\xC3\xA9", false, false, false, false, true));
    added_tokens.push_back(added("<mask>", false, true, true, false, false));
    added_tokens.push_back(added("<|x|>", true, true, false, true, true));
  }
  json pre = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json normalizer = nullptr;
  if (qwen_like) {
    normalizer = {{"type", "NFC"}};
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            json::array({{{"type", "Split"},
                          {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                          {"behavior", "Isolated"}, {"invert", false}},
                         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  }
  json j = {{"version", "1.0"}, {"added_tokens", added_tokens}, {"normalizer", normalizer},
            {"pre_tokenizer", pre}, {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list},
                       {"ignore_merges", qwen_like}}}};
  return j.dump();
}

void check(bool ok, int line = __builtin_LINE()) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: invariant at line %d broken\n", line);
    std::abort();
  }
}

void exercise(const Tokenizer& tok, std::string_view text, bool expect_round_trip) {
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, true);
  } catch (const perry::Error&) {
    // Only invalid UTF-8 may be rejected.
    check(perry::tokenizer::find_invalid_utf8(text).has_value());
    return;
  }
  const std::string full = tok.decode(ids, false);
  if (expect_round_trip && full != text) {
    std::fprintf(stderr, "round trip: \"%.*s\" -> \"%s\"\n", static_cast<int>(text.size()),
                 text.data(), full.c_str());
    check(false);
  }
  for (bool skip : {false, true}) {
    StreamDecoder sd(tok, skip);
    std::string streamed;
    for (int32_t id : ids) {
      std::string piece = sd.push(id);
      check(!perry::tokenizer::find_invalid_utf8(piece).has_value());
      streamed += piece;
    }
    streamed += sd.flush();
    check(streamed == tok.decode(ids, skip));
  }
  // Arbitrary ids (including unknown and split-byte ones) must decode without trouble.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < text.size() && i < 64; i += 2) {
    raw.push_back(static_cast<int32_t>(static_cast<uint8_t>(text[i]) |
                                       (static_cast<uint8_t>(text[i + 1]) << 8)) % 300 - 10);
  }
  check(!perry::tokenizer::find_invalid_utf8(tok.decode(raw, false)).has_value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer plain = Tokenizer::from_json(small_tokenizer_json(false), "fuzz-plain");
  static const Tokenizer qwen_like = Tokenizer::from_json(small_tokenizer_json(true), "fuzz-qwen");
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  try {
    Tokenizer t = Tokenizer::from_json(input, "fuzz-input.json");
    exercise(t, "hello world <|end|> 123 \xC3\xA9t\xC3\xA9  \n", false);
  } catch (const perry::Error&) {
  }
  exercise(plain, input, true);
  exercise(qwen_like, input, false);
  return 0;
}
