// Bad input must give a clear perry::Error, never a crash: invalid UTF-8 to encode, and
// truncated / mistyped / unsupported tokenizer.json files. Also the small accessors.
#include <gtest/gtest.h>

#include <type_traits>

#include "core/error.h"
#include "tok_test_support.h"
#include "tokenizer/tokenizer.h"

namespace perry::tokenizer::test {
namespace {

using nlohmann::json;

// A minimal valid byte-level tokenizer: bytes a, b, c, Ġ and merges to "ab", "abc".
json tiny() {
  return json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 6, "content": "<|end|>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                      "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
              "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "abc": 5},
              "merges": [["a", "b"], "ab c"]}
  })");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const perry::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG EXCEPTION TYPE: ") + e.what();
  }
  return "NO ERROR";
}

TEST(TokenizerErrors, InvalidUtf8NamesByteOffset) {
  Tokenizer tok = Tokenizer::from_json(tiny().dump(), "tiny.json");
  struct Case {
    std::string text;
    size_t offset;
  };
  const Case cases[] = {
      {"\xFF", 0},
      {"abc\x80", 3},
      {"ab\xE4\xB8", 2},               // truncated 3-byte sequence
      {"\xC0\xAF", 0},                 // overlong '/'
      {"ok \xED\xA0\x80 x", 3},        // UTF-16 surrogate
      {"\xF4\x90\x80\x80", 0},         // above U+10FFFF
      {"caf\xC3\xA9 \xE9t\xE9", 6},    // Latin-1 after valid UTF-8
      {std::string("a\0b\xC3", 4), 3},  // NUL is fine, the dangling lead byte is not
  };
  for (const Case& c : cases) {
    std::string msg = error_of([&] { tok.encode(c.text); });
    EXPECT_NE(msg.find("UTF-8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte offset " + std::to_string(c.offset) + " "), std::string::npos)
        << "text of " << c.text.size() << " bytes: " << msg;
  }
  // Valid edge cases are accepted.
  EXPECT_NO_THROW(tok.encode(std::string("a\0b", 3)));
  EXPECT_NO_THROW(tok.encode("\xF4\x8F\xBF\xBF \xEF\xBF\xBD"));
}

TEST(TokenizerErrors, MalformedJsonNamesFileAndPath) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> expect;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"unknown pre-tokenizer", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; },
       {"$.pre_tokenizer.type", "Whitespace"}},
      {"unknown nested pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", json::array({{{"type", "ByteLevel"}},
                                                              {{"type", "Metaspace"}}})}};
       },
       {"$.pre_tokenizer.pretokenizers[1].type", "Metaspace"}},
      {"unknown normalizer", [](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; },
       {"$.normalizer.type", "Lowercase"}},
      {"unknown decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; },
       {"$.decoder.type", "WordPiece"}},
      {"unknown post-processor", [](json& j) { j["post_processor"] = {{"type", "Magic"}}; },
       {"$.post_processor.type", "Magic"}},
      {"unsupported model", [](json& j) { j["model"]["type"] = "Unigram"; },
       {"$.model.type", "Unigram"}},
      {"vocab as array", [](json& j) { j["model"]["vocab"] = json::array({"a", "b"}); },
       {"$.model.vocab", "expected an object"}},
      {"vocab id as string", [](json& j) { j["model"]["vocab"]["a"] = "zero"; },
       {"$.model.vocab[\"a\"]", "integer"}},
      {"negative id", [](json& j) { j["model"]["vocab"]["a"] = -4; }, {"out of range"}},
      {"merge as number", [](json& j) { j["model"]["merges"][1] = 42; },
       {"$.model.merges[1]", "merge must be"}},
      {"merge without space", [](json& j) { j["model"]["merges"][1] = "abc"; },
       {"$.model.merges[1]", "\"a b\""}},
      {"merge of unknown token", [](json& j) { j["model"]["merges"][0] = {"a", "z"}; },
       {"$.model.merges[0]", "\"z\" is not in the vocab"}},
      {"merge result not in vocab", [](json& j) { j["model"]["merges"][0] = {"b", "c"}; },
       {"$.model.merges[0]", "\"bc\""}},
      {"missing model", [](json& j) { j.erase("model"); }, {"$", "\"model\""}},
      {"missing vocab", [](json& j) { j["model"].erase("vocab"); }, {"$.model", "\"vocab\""}},
      {"added token id string", [](json& j) { j["added_tokens"][0]["id"] = "7"; },
       {"$.added_tokens[0].id", "integer"}},
      {"added token lstrip string", [](json& j) { j["added_tokens"][0]["lstrip"] = "yes"; },
       {"$.added_tokens[0].lstrip", "true/false"}},
      {"added tokens object", [](json& j) { j["added_tokens"] = json::object(); },
       {"$.added_tokens", "array"}},
      {"bad regex",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L}+"}}},
                               {"behavior", "Isolated"}, {"invert", false}};
       },
       {"$.pre_tokenizer.pattern.Regex", "invalid regex"}},
      {"bad split behavior",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}},
                               {"behavior", "Sideways"}, {"invert", false}};
       },
       {"$.pre_tokenizer.behavior", "Sideways"}},
      {"template with unknown special",
       [](json& j) {
         j["post_processor"] = {
             {"type", "TemplateProcessing"},
             {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
             {"special_tokens", json::object()}};
       },
       {"$.post_processor.single[0].SpecialToken.id", "<s>"}},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, {"$.model.dropout", "dropout"}},
      {"unk token missing", [](json& j) { j["model"]["unk_token"] = "<unk>"; },
       {"$.model.unk_token", "<unk>"}},
      {"top level array", [](json& j) { j = json::array({1, 2}); }, {"$", "object"}},
  };
  for (const Case& c : cases) {
    json j = tiny();
    c.edit(j);
    std::string msg = error_of([&] { Tokenizer::from_json(j.dump(), "bad/tokenizer.json"); });
    EXPECT_NE(msg.find("bad/tokenizer.json"), std::string::npos) << c.what << ": " << msg;
    for (const std::string& s : c.expect) {
      EXPECT_NE(msg.find(s), std::string::npos) << c.what << ": expected \"" << s << "\" in: " << msg;
    }
  }
}

TEST(TokenizerErrors, TruncatedAndGarbageFiles) {
  const std::string full = read_file(qwen3_json_path());
  for (size_t len : {size_t{0}, size_t{1}, size_t{100}, size_t{5000}, full.size() / 2,
                     full.size() - 2}) {
    std::string msg = error_of([&] { Tokenizer::from_json(full.substr(0, len), "trunc.json"); });
    EXPECT_NE(msg.find("trunc.json"), std::string::npos) << "len " << len << ": " << msg;
    EXPECT_NE(msg.find("JSON"), std::string::npos) << msg;
  }
  for (const char* g : {"null", "42", "\"str\"", "{}", "{\"model\": null}", "\xFF\xFE{}"}) {
    std::string msg = error_of([&] { Tokenizer::from_json(g, "garbage.json"); });
    EXPECT_NE(msg.find("garbage.json"), std::string::npos) << g << ": " << msg;
  }
  std::string msg = error_of([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); });
  EXPECT_NE(msg.find("/nonexistent/tokenizer.json"), std::string::npos) << msg;
}

TEST(TokenizerBasics, TinyTokenizerBehaviour) {
  Tokenizer tok = Tokenizer::from_json(tiny().dump(), "tiny.json");
  // "abc" merges fully; "ab c" splits at the space ("Ġ" then "c"); unknown bytes are dropped.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ(tok.encode("ab c"), (std::vector<int32_t>{4, 3, 2}));
  EXPECT_EQ(tok.encode("ab<|end|>ba"), (std::vector<int32_t>{4, 6, 1, 0}));
  EXPECT_EQ(tok.decode({4, 6, 1, 0}), "ab<|end|>ba");
  EXPECT_EQ(tok.decode({4, 6, 1, 0}, true), "abba");
  EXPECT_EQ(tok.decode({4, 99, -1, 1}), "abb");  // unknown ids are skipped, as in HF
  EXPECT_EQ(tok.vocab_size(), 7);
  EXPECT_TRUE(tok.is_special(6));
  EXPECT_FALSE(tok.is_special(4));
  EXPECT_EQ(tok.token_text(3), "Ġ");
  EXPECT_EQ(tok.token_id("abc"), 5);
  EXPECT_EQ(tok.token_id("<|end|>"), 6);
  EXPECT_FALSE(tok.token_id("zzz").has_value());
  EXPECT_NE(error_of([&] { tok.token_text(7); }), "NO ERROR");
  EXPECT_NE(error_of([&] { tok.token_text(-3); }), "NO ERROR");

  // Movable, as the API promises.
  static_assert(std::is_nothrow_move_constructible_v<Tokenizer>);
  Tokenizer moved = std::move(tok);
  EXPECT_EQ(moved.encode("abc"), (std::vector<int32_t>{5}));
}

TEST(TokenizerBasics, RealVocabAccessors) {
  // Expectations read straight from the JSON files, independently of the tokenizer code.
  for (const std::string& path : {qwen3_json_path(), llama3_json_path()}) {
    json j = json::parse(read_file(path));
    Tokenizer tok = Tokenizer::from_file(path);
    int64_t max_id = -1;
    for (const auto& [k, v] : j["model"]["vocab"].items()) max_id = std::max<int64_t>(max_id, v);
    for (const auto& t : j["added_tokens"]) max_id = std::max<int64_t>(max_id, t["id"]);
    EXPECT_EQ(tok.vocab_size(), max_id + 1) << path;
    size_t n = 0;
    for (const auto& [k, v] : j["model"]["vocab"].items()) {
      if (n++ % 997 != 0) continue;  // a spread sample
      EXPECT_EQ(tok.token_text(v.get<int32_t>()), k);
      EXPECT_EQ(tok.token_id(k), v.get<int32_t>());
    }
    for (const auto& t : j["added_tokens"]) {
      EXPECT_EQ(tok.is_special(t["id"]), t["special"].get<bool>());
      EXPECT_EQ(tok.token_text(t["id"]), t["content"].get<std::string>());
    }
  }
}

TEST(TokenizerBasics, StreamDecoderHoldsBackPartialCharacters) {
  Tokenizer tok = Tokenizer::from_file(qwen3_json_path());
  // "€" is E2 82 AC: three single-byte tokens. Nothing may come out before the last one.
  std::vector<int32_t> ids;
  for (const char* t : {"â", "Ĥ", "¬"}) {
    auto id = tok.token_id(t);
    ASSERT_TRUE(id.has_value()) << t;
    ids.push_back(*id);
  }
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]), "\xE2\x82\xAC");
  EXPECT_EQ(sd.flush(), "");
  // An unfinished character at the end becomes one U+FFFD on flush, as decode() does.
  StreamDecoder sd2(tok);
  EXPECT_EQ(sd2.push(ids[0]), "");
  EXPECT_EQ(sd2.push(ids[1]), "");
  EXPECT_EQ(sd2.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode({ids[0], ids[1]}), "\xEF\xBF\xBD");
  // Special tokens are skipped by default and kept on request.
  const int32_t im_end = *tok.token_id("<|im_end|>");
  StreamDecoder skip(tok), keep(tok, false);
  EXPECT_EQ(skip.push(im_end), "");
  EXPECT_EQ(keep.push(im_end), "<|im_end|>");
}

}  // namespace
}  // namespace perry::tokenizer::test
