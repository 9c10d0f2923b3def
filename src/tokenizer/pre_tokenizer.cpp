#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <array>
#include <utility>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace perry::tokenizer {

namespace {

struct ByteLevelTable {
  std::array<std::string, 256> to_char;
  std::array<int, 512> from_cp;  // every mapped code point is < 0x144
  ByteLevelTable() {
    from_cp.fill(-1);
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = printable[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(cp, to_char[b]);
      from_cp[cp] = b;
    }
  }
};

const ByteLevelTable& byte_table() {
  static const ByteLevelTable t;
  return t;
}

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const JsonNode& node) {
  const std::string s = node.str();
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  node.fail_here("unknown split behavior \"{}\" (expected Removed, Isolated, MergedWithPrevious, "
                 "MergedWithNext or Contiguous)", s);
}

struct Span {
  size_t begin, end;
  bool flag;  // is_match before the behavior is applied, "remove" after
};

// Splits `text` at the regex matches exactly as HF's NormalizedString::split does.
void split_piece(const Regex& re, SplitBehavior behavior, bool invert, const std::string& text,
                 std::vector<std::pair<size_t, size_t>>& matches, std::vector<Span>& spans,
                 std::vector<std::string>& out) {
  re.find_all(text, matches);
  spans.clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});

  std::vector<Span> result;
  result.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto s : spans) result.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      result = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (auto s : spans) {
        if (s.flag == prev_match && !result.empty()) {
          result.back().end = s.end;
        } else {
          result.push_back({s.begin, s.end, false});
        }
        prev_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (auto s : spans) {
        if (s.flag && !prev_match && !result.empty()) {
          result.back().end = s.end;
        } else {
          result.push_back({s.begin, s.end, false});
        }
        prev_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span s = spans[i];
        if (s.flag && !prev_match && !result.empty()) {
          result.back().begin = s.begin;
        } else {
          result.push_back({s.begin, s.end, false});
        }
        prev_match = s.flag;
      }
      std::reverse(result.begin(), result.end());
      break;
    }
  }
  for (const Span& s : result) {
    if (!s.flag && s.end > s.begin) out.emplace_back(text, s.begin, s.end - s.begin);
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, SplitBehavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<Span> spans;
    for (const std::string& p : pieces) split_piece(*re_, behavior_, invert_, p, matches, spans, out);
    pieces = std::move(out);
  }

 private:
  std::unique_ptr<Regex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        re_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, false) : nullptr) {}

  void pre_tokenize(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_) {
      for (std::string& p : pieces) {
        if (p.empty() || p[0] != ' ') p.insert(p.begin(), ' ');
      }
    }
    if (re_) {
      std::vector<std::string> out;
      std::vector<std::pair<size_t, size_t>> matches;
      std::vector<Span> spans;
      for (const std::string& p : pieces) {
        split_piece(*re_, SplitBehavior::kIsolated, false, p, matches, spans, out);
      }
      pieces = std::move(out);
    }
    const ByteLevelTable& t = byte_table();
    std::string mapped;
    for (std::string& p : pieces) {
      mapped.clear();
      for (char c : p) mapped += t.to_char[static_cast<unsigned char>(c)];
      std::swap(p, mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

std::unique_ptr<Regex> make_split_regex(const JsonNode& pattern) {
  pattern.require_object();
  auto regex = pattern.find("Regex");
  auto literal = pattern.find("String");
  if (regex && literal) pattern.fail_here("pattern has both \"Regex\" and \"String\"");
  if (!regex && !literal) pattern.fail_here("pattern needs a \"Regex\" or a \"String\" field");
  const JsonNode& n = regex ? *regex : *literal;
  try {
    return std::make_unique<Regex>(n.str(), !regex);
  } catch (const perry::Error& e) {
    n.fail_here("{}", e.what());
  }
}

}  // namespace

const std::string& byte_level_char(unsigned char b) { return byte_table().to_char[b]; }

int byte_level_byte(char32_t cp) {
  return cp < 512 ? byte_table().from_cp[cp] : -1;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonNode& node) {
  if (node.is_null()) return nullptr;
  JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  if (type == "Split") {
    auto re = make_split_regex(node.at("pattern"));
    SplitBehavior behavior = parse_behavior(node.at("behavior"));
    bool invert = node.bool_or("invert", false);
    return std::make_unique<SplitPreTokenizer>(std::move(re), behavior, invert);
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(node.bool_or("add_prefix_space", true),
                                                   node.bool_or("use_regex", true));
  }
  if (type == "Sequence") {
    JsonNode list = node.at("pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      JsonNode item = list[i];
      if (item.is_null()) item.fail_here("expected a pre-tokenizer object, got null");
      parts.push_back(make_pre_tokenizer(item));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  type_node.fail_here("unsupported pre-tokenizer type \"{}\" (supported: Split, ByteLevel, "
                      "Sequence)", type);
}

}  // namespace perry::tokenizer
