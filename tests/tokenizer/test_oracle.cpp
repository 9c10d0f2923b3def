// perry's tokenizer against the Hugging Face `tokenizers` library on the real Qwen3 and
// Llama-3 tokenizer.json: llama.cpp's vocab vectors, a ≥ 1 MiB corpus, random id sequences,
// round trips and streaming decode. Every expected value comes from the oracle at test time.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include "tok_test_support.h"
#include "tokenizer/tokenizer.h"

namespace perry::tokenizer::test {
namespace {

struct ModelCase {
  const char* name;
  std::string (*json_path)();
  const char* llamacpp_vocab;
};

// gtest prints parameters in test names and logs; the name is what identifies a case.
void PrintTo(const ModelCase& m, std::ostream* os) { *os << m.name; }

const Tokenizer& load(const ModelCase& m) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[m.name];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::from_file(m.json_path()));
  return *slot;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 40; ++i) s += std::to_string(v[i]) + " ";
  if (v.size() > 40) s += "... (" + std::to_string(v.size()) + " ids)";
  return s;
}

// Index of the first differing id, to point at the failing spot in a long encoding.
size_t first_diff(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// Streams `ids` through a StreamDecoder, checking every piece is valid UTF-8.
std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                          size_t* invalid_pieces) {
  StreamDecoder sd(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    if (!is_valid_utf8(piece)) ++*invalid_pieces;
    all += piece;
  }
  std::string tail = sd.flush();
  if (!is_valid_utf8(tail)) ++*invalid_pieces;
  return all + tail;
}

// Compares every encode/decode result for `texts` with the oracle; returns the number of cases.
void compare_with_oracle(const Tokenizer& tok, const std::vector<std::string>& texts,
                         const OracleResult& o, const std::string& what) {
  size_t failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    const auto& exp = o.encodings[i];
    const std::string ctx = what + " case " + std::to_string(i);
    std::vector<int32_t> ids = tok.encode(texts[i], true);
    std::vector<int32_t> plain = tok.encode(texts[i], false);
    if (ids != exp.ids) {
      size_t d = first_diff(ids, exp.ids);
      ADD_FAILURE() << ctx << ": encode(add_special_tokens=true) differs at id #" << d
                    << "\n  perry: " << show(std::vector<int32_t>(ids.begin() + std::min(d, ids.size()), ids.end()))
                    << "\n  HF:    " << show(std::vector<int32_t>(exp.ids.begin() + std::min(d, exp.ids.size()), exp.ids.end()))
                    << "\n  text:  " << texts[i].substr(0, 300);
      ++failures;
    }
    if (plain != exp.ids_no_special) {
      ADD_FAILURE() << ctx << ": encode(add_special_tokens=false) differs at id #"
                    << first_diff(plain, exp.ids_no_special);
      ++failures;
    }
    if (tok.decode(exp.ids, false) != exp.decoded) {
      ADD_FAILURE() << ctx << ": decode(skip_special=false) differs";
      ++failures;
    }
    if (tok.decode(exp.ids, true) != exp.decoded_skip_special) {
      ADD_FAILURE() << ctx << ": decode(skip_special=true) differs";
      ++failures;
    }
    for (bool skip : {false, true}) {
      size_t invalid = 0;
      std::string streamed = stream_decode(tok, exp.ids, skip, &invalid);
      EXPECT_EQ(invalid, 0u) << ctx << ": StreamDecoder emitted invalid UTF-8";
      if (streamed != (skip ? exp.decoded_skip_special : exp.decoded)) {
        ADD_FAILURE() << ctx << ": streamed decode (skip=" << skip << ") != full decode";
        ++failures;
      }
    }
  }
  EXPECT_EQ(failures, 0u) << what << ": stopped after the first failures";
}

class OracleTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(OracleTest, LlamaCppVocabVectors) {
  const ModelCase& m = GetParam();
  VocabVectors v = load_llamacpp_vectors(m.llamacpp_vocab);
  ASSERT_EQ(v.texts.size(), 46u);
  const Tokenizer& tok = load(m);
  OracleResult o = run_oracle(m.json_path(), v.texts);
  compare_with_oracle(tok, v.texts, o, std::string(m.name) + " llama.cpp vectors");
  // llama.cpp's expected ids were made with the same vocab (Qwen2 = Qwen3 below the added
  // tokens; llama-bpe = Llama-3): they must agree with both the oracle and perry.
  for (size_t i = 0; i < v.texts.size(); ++i) {
    EXPECT_EQ(o.encodings[i].ids_no_special, v.ids[i]) << "oracle vs .out, case " << i;
    EXPECT_EQ(tok.encode(v.texts[i], false), v.ids[i]) << "perry vs .out, case " << i;
  }
}

TEST_P(OracleTest, MegabyteCorpus) {
  const ModelCase& m = GetParam();
  const std::string& full = corpus();
  ASSERT_GE(full.size(), 1u << 20);
  std::vector<std::string> texts = corpus_chunks();
  const size_t n_chunks = texts.size();
  texts.push_back(full);  // the whole megabyte as one input too
  OracleResult o = run_oracle(m.json_path(), texts);
  const Tokenizer& tok = load(m);
  compare_with_oracle(tok, texts, o, std::string(m.name) + " corpus");

  // Round trip: decode(encode(x)) == x for every chunk, except where the oracle itself shows
  // the normalizer rewrote the text (NFC); those cases must exist for Qwen (the corpus has
  // decomposed accents) and equal the oracle's text.
  size_t normalized_cases = 0;
  for (size_t i = 0; i < n_chunks; ++i) {
    std::string rt = tok.decode(tok.encode(texts[i], false), false);
    if (o.encodings[i].roundtrip != texts[i]) {
      ++normalized_cases;
      EXPECT_EQ(rt, o.encodings[i].roundtrip) << "chunk " << i;
    } else {
      EXPECT_EQ(rt, texts[i]) << "round trip, chunk " << i;
    }
  }
  std::printf("[ %s ] corpus: %zu bytes, %zu chunks, %zu chunks rewritten by the normalizer\n",
              m.name, full.size(), n_chunks, normalized_cases);
  if (std::string(m.name) == "qwen3") {
    EXPECT_GT(normalized_cases, 0u);
  } else {
    EXPECT_EQ(normalized_cases, 0u);
  }
}

// Decoding arbitrary id sequences: byte tokens that split characters, special tokens, ids
// past the vocab. Exercises the U+FFFD replacement rules against HF's from_utf8_lossy.
TEST_P(OracleTest, RandomIdSequencesDecode) {
  const ModelCase& m = GetParam();
  const Tokenizer& tok = load(m);
  uint64_t s = 12345;
  auto next = [&s] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(s >> 33);
  };
  // Single-byte tokens for the bytes ≥ 0x80 (continuation and lead bytes).
  std::vector<int32_t> byte_ids;
  for (const char* t : {"Ã", "Â", "¤", "½", "ä", "¸", "Ń", "ð", "Ł", "ĺ", "ı", "Ģ", "ł"}) {
    if (auto id = tok.token_id(t)) byte_ids.push_back(*id);
  }
  ASSERT_GE(byte_ids.size(), 10u);
  std::vector<std::vector<int32_t>> lists;
  for (int n = 0; n < 300; ++n) {
    std::vector<int32_t> ids;
    size_t len = 1 + next() % 24;
    for (size_t k = 0; k < len; ++k) {
      uint32_t kind = next() % 10;
      if (kind < 5) ids.push_back(byte_ids[next() % byte_ids.size()]);
      else if (kind < 8) ids.push_back(static_cast<int32_t>(next() % tok.vocab_size()));
      else if (kind < 9) ids.push_back(tok.vocab_size() - 1 - static_cast<int32_t>(next() % 30));
      else ids.push_back(tok.vocab_size() + static_cast<int32_t>(next() % 5));  // unknown id
    }
    lists.push_back(std::move(ids));
  }
  OracleResult o = run_oracle(m.json_path(), {}, lists);
  size_t failures = 0;
  for (size_t i = 0; i < lists.size() && failures < 5; ++i) {
    for (bool skip : {false, true}) {
      const std::string& exp = skip ? o.decodings[i].decoded_skip_special : o.decodings[i].decoded;
      std::string got = tok.decode(lists[i], skip);
      size_t invalid = 0;
      std::string streamed = stream_decode(tok, lists[i], skip, &invalid);
      if (got != exp || streamed != exp || invalid != 0) {
        ++failures;
        ADD_FAILURE() << m.name << " id list " << i << " skip=" << skip << ": " << show(lists[i])
                      << "\n  HF:       " << exp << "\n  decode:   " << got
                      << "\n  streamed: " << streamed << " (invalid pieces " << invalid << ")";
      }
    }
  }
}

// Not a timed assertion: prints encode throughput into the test log.
TEST_P(OracleTest, EncodeThroughput) {
  const ModelCase& m = GetParam();
  const std::string& text = corpus();
  Tokenizer fresh = Tokenizer::from_file(m.json_path());  // cold pre-token cache
  std::vector<double> secs;
  size_t n_ids = 0;
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    n_ids = fresh.encode(text, false).size();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double cold = secs[0];
  std::vector<double> warm(secs.begin() + 1, secs.end());
  std::sort(warm.begin(), warm.end());
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("[ %s ] encode %.2f MB -> %zu ids: cold %.1f MB/s, warm median %.1f MB/s\n", m.name,
              mb, n_ids, mb / cold, mb / warm[warm.size() / 2]);
  EXPECT_GT(n_ids, text.size() / 10);
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, OracleTest,
                         ::testing::Values(ModelCase{"qwen3", qwen3_json_path, "qwen2"},
                                           ModelCase{"llama3", llama3_json_path, "llama-bpe"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace perry::tokenizer::test
