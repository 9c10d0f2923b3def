// Component coverage beyond what the two real files use: variants of a shrunken Qwen3
// tokenizer.json (first 3000 merges) with other pre-tokenizers, Split behaviors and invert,
// added-token flags (lstrip / rstrip / single_word / normalized), normalizers, post-processors
// and decoders. Every variant is checked against the HF oracle on the same file.
#include <gtest/gtest.h>

#include <deque>

#include <functional>

#include "tok_test_support.h"
#include "tokenizer/tokenizer.h"

namespace perry::tokenizer::test {
namespace {

using nlohmann::json;

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Qwen3 reduced to the first `n_merges` merges and the vocab they need (the 256 byte chars
// plus each merge result), ids unchanged. Small enough to load fast in both implementations.
const json& small_qwen() {
  static const json j = [] {
    json full = json::parse(read_file(qwen3_json_path()));
    const size_t n_merges = 3000;
    json& model = full["model"];
    json vocab = json::object();
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (code_points(it.key()) == 1) vocab[it.key()] = it.value();
    }
    json merges = json::array();
    for (size_t i = 0; i < n_merges; ++i) {
      const json& m = model["merges"][i];
      std::string joined = m[0].get<std::string>() + m[1].get<std::string>();
      vocab[joined] = model["vocab"][joined];
      merges.push_back(m);
    }
    model["vocab"] = vocab;
    model["merges"] = merges;
    return full;
  }();
  return j;
}

json byte_level(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space},
          {"trim_offsets", false}, {"use_regex", use_regex}};
}

json added(int id, const std::string& content, bool special, bool normalized, bool lstrip = false,
           bool rstrip = false, bool single_word = false) {
  return {{"id", id}, {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

std::vector<std::string> variant_texts() {
  std::vector<std::string> t = {
      "Hello, world. This is   a test,with commas.and dots",
      "  leading and trailing spaces  ",
      "tabs\tand\nnewlines\r\nmixed \n\n\n",
      "<mask> at start, in the <mask>middle<mask> and end <mask>",
      "  <mask>  spaced   <mask>\t\tthere\t<mask>\t<mask>\xE2\x80\x80",
      "hello world; say hello, then hellos and shello: hello",
      "ab abc cab ab. (ab) _ab ab_ \xCC\x81" "ab",
      "caf\xC3\xA9 and cafe\xCC\x81 and CAF\xC3\x89",
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
      "<|X|> and   <|X|> and\t<|X|>",
      "\xE2\x91\xA0 \xEF\xAC\x81nance \xE2\x84\xAB \xEF\xBC\xA1\xEF\xBC\xA2 x\xC2\xB2",
      "你好，世界！こんにちは 안녕 مرحبا 👍🏽 👨‍👩‍👧",
      "digits 1234567890 and 3.14159, 1,000,000",
      "I'M here, you'RE there, it's THEIR's",
      "",
      " ",
      ",,,...,,,",
  };
  VocabVectors v = load_llamacpp_vectors("qwen2");
  t.insert(t.end(), v.texts.begin(), v.texts.end());
  std::vector<std::string> chunks = corpus_chunks();
  for (size_t i = 0; i < 6 && i < chunks.size(); ++i) t.push_back(chunks[i * 7 % chunks.size()]);
  return t;
}

struct Variant {
  const char* name;
  std::function<void(json&)> edit;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"base", [](json&) {}});
  v.push_back({"gpt2_bytelevel_template", [](json& j) {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = byte_level(true, true);
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"SpecialToken", {{"id", "<|im_end|>"}, {"type_id", 0}}}}})},
        {"pair", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens",
         {{"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {151644}}, {"tokens", {"<|im_start|>"}}}},
          {"<|im_end|>", {{"id", "<|im_end|>"}, {"ids", {151645}}, {"tokens", {"<|im_end|>"}}}}}}};
    j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({byte_level(true, true)})}};
  }});
  for (const char* behavior :
       {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"}) {
    for (bool invert : {false, true}) {
      // A deque never moves its elements, so the c_str() handed out stays valid (a vector
      // would reallocate and leave dangling pointers: caught by ASan).
      static std::deque<std::string> names;
      names.push_back(std::string("split_") + behavior + (invert ? "_invert" : ""));
      std::string b = behavior;
      v.push_back({names.back().c_str(), [b, invert](json& j) {
        j["pre_tokenizer"] = {
            {"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\s+|[,.]"}}},
                           {"behavior", b}, {"invert", invert}},
                          byte_level(false, false)})}};
      }});
    }
  }
  v.push_back({"split_string_pattern", [](json& j) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"String", ", "}}},
                                        {"behavior", "Removed"}, {"invert", false}},
                                       byte_level(true, false)})}};
  }});
  v.push_back({"added_token_flags", [](json& j) {
    auto& a = j["added_tokens"];
    a.push_back(added(151700, "<mask>", false, false, true, true));
    a.push_back(added(151701, "hello", false, true, false, false, true));
    a.push_back(added(151702, "\xC3\xA9", false, true));       // é, matched after NFC
    a.push_back(added(151703, "ab", false, false, false, false, true));
    a.push_back(added(151704, "<|X|>", true, true, true, false));
    a.push_back(added(151705, "\xC3\x89", true, false));       // É special, not normalized
  }});
  v.push_back({"nfkc_nfd_sequence", [](json& j) {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", json::array({{{"type", "NFD"}}, {{"type", "NFKC"}}})}};
  }});
  v.push_back({"nfd_only", [](json& j) { j["normalizer"] = {{"type", "NFD"}}; }});
  v.push_back({"no_pretokenizer_no_decoder", [](json& j) {
    // BPE then sees raw text: characters outside the byte-level alphabet have no vocab entry
    // and are dropped (no unk token); decode joins tokens with spaces.
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = nullptr;
    j["normalizer"] = nullptr;
  }});
  v.push_back({"string_merges_ignore_merges", [](json& j) {
    json merges = json::array();
    for (const auto& m : j["model"]["merges"]) {
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
    j["model"]["merges"] = merges;
    j["model"]["ignore_merges"] = true;
    // Tokens reachable only whole (no merge path) show what ignore_merges changes.
    j["model"]["vocab"]["Ġworld"] = 1879;
  }});
  v.push_back({"roberta_processing", [](json& j) {
    j["post_processor"] = {{"type", "RobertaProcessing"},
                           {"sep", {"<|im_end|>", 151645}},
                           {"cls", {"<|im_start|>", 151644}},
                           {"trim_offsets", true},
                           {"add_prefix_space", false}};
  }});
  v.push_back({"post_sequence_bytelevel_template", [](json& j) {
    j["post_processor"] = {
        {"type", "Sequence"},
        {"processors",
         json::array({byte_level(false, false),
                      {{"type", "TemplateProcessing"},
                       {"single", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                               {{"SpecialToken", {{"id", "eos"}, {"type_id", 0}}}}})},
                       {"pair", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
                       {"special_tokens",
                        {{"eos", {{"id", "eos"}, {"ids", {151643, 151645}},
                                  {"tokens", {"<|endoftext|>", "<|im_end|>"}}}}}}}})}};
  }});
  return v;
}

TEST(TokenizerVariants, AgreeWithHuggingFace) {
  const std::vector<std::string> texts = variant_texts();
  ScratchDir dir;
  size_t checked = 0;
  for (const Variant& var : variants()) {
    SCOPED_TRACE(var.name);
    json j = small_qwen();
    var.edit(j);
    const std::string path = dir.path() + "/" + var.name + ".json";
    const std::string text = j.dump();
    write_file(path, text);
    OracleResult o = run_oracle(path, texts);
    Tokenizer tok = Tokenizer::from_json(text, path);
    size_t failures = 0;
    for (size_t i = 0; i < texts.size() && failures < 3; ++i) {
      const auto& exp = o.encodings[i];
      std::vector<int32_t> ids = tok.encode(texts[i], true);
      std::vector<int32_t> plain = tok.encode(texts[i], false);
      bool ok = ids == exp.ids && plain == exp.ids_no_special &&
                tok.decode(exp.ids, false) == exp.decoded &&
                tok.decode(exp.ids, true) == exp.decoded_skip_special;
      if (!ok) {
        ++failures;
        std::string a, b;
        for (int32_t x : ids) a += std::to_string(x) + " ";
        for (int32_t x : exp.ids) b += std::to_string(x) + " ";
        ADD_FAILURE() << var.name << " text #" << i << " \"" << texts[i].substr(0, 120)
                      << "\"\n  perry: " << a.substr(0, 400) << "\n  HF:    " << b.substr(0, 400)
                      << "\n  decode perry: \"" << tok.decode(exp.ids, false).substr(0, 200)
                      << "\"\n  decode HF:    \"" << exp.decoded.substr(0, 200) << "\"";
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000u);
}

}  // namespace
}  // namespace perry::tokenizer::test
