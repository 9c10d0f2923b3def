// Deterministic ≥ 1 MiB test corpus: real local files (C/C++ headers, licenses, release notes)
// interleaved with generated text that hits every tokenizer corner the real files lack — CJK,
// Arabic, Devanagari, emoji with ZWJ and skin tones, decomposed accents and Hangul jamo (NFC),
// digit runs, whitespace runs (tabs, \r\n, trailing spaces, NBSP, NEL, ideographic space),
// contractions in odd cases, and special tokens in the middle of words.
#include <filesystem>
#include <string>
#include <vector>

#include "tok_test_support.h"

namespace perry::tokenizer::test {

namespace {

// splitmix64: fixed, portable sequence (std distributions differ between libraries).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  template <typename T, size_t N>
  const T& pick(const T (&a)[N]) { return a[below(N)]; }
};

const char* const kWords[] = {
    // English, with contractions in every case the (?i:'s|'t|...) alternative must fold.
    "the", "The", "THE", "tokenizer", "don't", "DON'T", "I'm", "I'M", "we'll", "WE'LL", "you've",
    "they're", "She'd", "it's", "IT'S", "o'clock", "rock'n'roll", "ſ's",
    // European languages (precomposed).
    "Äpfel", "Straße", "naïve", "façade", "café", "señor", "Ελληνικά", "Привет", "мир", "Żółć",
    "İstanbul", "ǅemal", "ﬁnance",
    // CJK, Japanese, Korean.
    "你好", "世界", "自然语言处理", "東京都", "ひらがな", "カタカナ", "한국어", "안녕하세요",
    "中文分词器的测试", "𠀀𠀁", "ｆｕｌｌｗｉｄｔｈ",
    // RTL and Indic scripts, Thai.
    "مرحبا", "بالعالم", "العربية", "שלום", "हिन्दी", "नमस्ते", "ภาษาไทย", "ক্ষ",
    // Numerals the \p{N} class must catch beyond ASCII.
    "٣٤٥", "３４５", "Ⅻ", "½", "x²", "①②", "१२३",
};

const char* const kEmoji[] = {
    "😀", "👍", "👍🏽", "👋🏿", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🇺🇸", "🇯🇵", "1️⃣", "❤️", "🧑🏻‍🤝‍🧑🏼",
    "🤷‍♀️", "🐈‍⬛", "✈︎", "🫠",
};

// Decomposed sequences and singletons that NFC rewrites.
const char* const kDecomposed[] = {
    "e\xCC\x81", "a\xCC\x88", "n\xCC\x83", "A\xCC\x8A", "o\xCC\x82\xCC\xA3", "u\xCC\x88\xCC\x81",
    "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8",  // Hangul jamo ᄀ ᅡ ᆨ → 각
    "\xE2\x84\xAB",                          // ANGSTROM SIGN → Å
    "\xE2\x84\xA6",                          // OHM SIGN → Ω
    "\xEF\xA4\x80",                          // CJK COMPATIBILITY IDEOGRAPH F900 → 豈
    "Cafe\xCC\x81", "re\xCC\x81sume\xCC\x81", "\xE0\xA4\x95\xE0\xA4\xBC",
};

const char* const kSpaces[] = {
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "   \n", "\t \n",
    "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\x89", "\xC2\x85", "\xE2\x80\x8B", "\x0B", "\x0C",
    "          ", " \r", "\n \n",
};

const char* const kSpecial[] = {
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
    "<|start_header_id|>", "<think>", "</think>", "<|im_start", "<|im_start|", "<|<|im_end|>|>",
    "<|reserved_special_token_7|>", "<tool_call>",
};

const char* const kPunct[] = {
    ".", ",", "!", "?", "...", "—", "–", "«", "»", "“", "”", "'", "\"", "(", ")", "[", "]", "{",
    "}", "->", "=>", "::", "!=", "==", "&&", "||", "#", "@", "$", "%", "^", "&", "*", "~", "`",
    "©", "™", "°", "±", "→", "∑", "√", "∞", "§", "¶", "•", "''", "'''",
};

std::string digits(Rng& r) {
  std::string s;
  size_t n = 1 + r.below(r.below(4) == 0 ? 40 : 6);
  for (size_t i = 0; i < n; ++i) s += static_cast<char>('0' + r.below(10));
  if (r.below(4) == 0) s += "." + std::to_string(r.below(1000));
  if (r.below(6) == 0) s = "1,234,567" + s;
  return s;
}

std::string code_snippet(Rng& r) {
  static const char* const kSnippets[] = {
      "def f(x):\n    return x**2 + 3*x - 1\n",
      "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
      "{\"key\": \"value\", \"n\": 12345, \"list\": [1, 2, 3], \"ok\": true}\n",
      "const x = await fetch(`https://example.com/api?q=${query}&page=2`);\n",
      "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
      "    if err != nil {\n        return nil, fmt.Errorf(\"read: %w\", err)\n    }\n",
      "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v.size(); }\n",
      "mailto:someone@example.org  http://localhost:8080/v1/chat/completions\n",
      "x = [i for i in range(100) if i % 7 == 0]  # trailing comment   \n",
      "\t\t\treturn;\t\t\n\r\n    }   \n",
  };
  return r.pick(kSnippets);
}

std::string generated_paragraph(Rng& r) {
  std::string s;
  size_t n = 20 + r.below(200);
  for (size_t i = 0; i < n; ++i) {
    switch (r.below(16)) {
      case 0: case 1: case 2: case 3: case 4: case 5: s += r.pick(kWords); break;
      case 6: s += r.pick(kEmoji); break;
      case 7: s += r.pick(kDecomposed); break;
      case 8: s += digits(r); break;
      case 9: case 10: s += r.pick(kPunct); break;
      case 11: s += r.pick(kSpaces); break;
      case 12: s += r.below(3) == 0 ? r.pick(kSpecial) : r.pick(kWords); break;
      case 13: s += code_snippet(r); break;
      default: break;
    }
    // Mostly single spaces between items, sometimes nothing (glued tokens).
    if (r.below(5) != 0) s += ' ';
  }
  s += r.pick(kSpaces);
  return s;
}

void append_file(const std::string& path, size_t max_bytes, std::string& out) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  std::string data = read_file(path);
  if (data.size() > max_bytes) data.resize(max_bytes);
  // Cut back to a character boundary and skip files that are not UTF-8 text.
  while (!data.empty() && (static_cast<unsigned char>(data.back()) & 0xC0) == 0x80) data.pop_back();
  if (!data.empty() && static_cast<unsigned char>(data.back()) >= 0xC0) data.pop_back();
  if (!is_valid_utf8(data) || data.find('\0') != std::string::npos) return;
  out += data;
}

std::string build_corpus() {
  static const char* const kFiles[] = {
      "/usr/share/common-licenses/GPL-3",
      "/usr/share/common-licenses/Apache-2.0",
      "/usr/share/common-licenses/MPL-2.0",
      "/usr/share/common-licenses/Artistic",
      "/usr/include/stdio.h",
      "/usr/include/stdlib.h",
      "/usr/include/pthread.h",
      "/usr/include/utf8proc.h",
      "/usr/include/pcre2.h",
      "/usr/include/c++/12/bits/stl_algo.h",
      "/usr/include/nlohmann/json.hpp",
      "/usr/share/doc/git/RelNotes/2.20.0.txt",
      "/usr/share/doc/dpkg/spec/triggers.txt",
      "/usr/share/gcc/python/libstdcxx/v6/printers.py",
  };
  Rng r{20240611};
  std::string out;
  for (const char* f : kFiles) {
    append_file(f, 64 * 1024, out);
    for (int i = 0; i < 25; ++i) out += generated_paragraph(r);
  }
  // Top up with generated text so the corpus is ≥ 1 MiB whatever files exist here.
  while (out.size() < (1u << 20) + 4096) out += generated_paragraph(r);
  return out;
}

}  // namespace

const std::string& corpus() {
  static const std::string c = build_corpus();
  return c;
}

std::vector<std::string> corpus_chunks() {
  const std::string& c = corpus();
  Rng r{7};
  std::vector<std::string> chunks;
  size_t pos = 0;
  while (pos < c.size()) {
    size_t len = std::min(c.size() - pos, 1024 + r.below(8192));
    // Never cut inside a UTF-8 character.
    while (pos + len < c.size() && (static_cast<unsigned char>(c[pos + len]) & 0xC0) == 0x80) ++len;
    chunks.push_back(c.substr(pos, len));
    pos += len;
  }
  return chunks;
}

}  // namespace perry::tokenizer::test
