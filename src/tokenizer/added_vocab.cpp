#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace perry::tokenizer {

namespace {

// Last character of s[0, end) (s valid UTF-8, end > 0).
char32_t last_char(std::string_view s, size_t end) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
  size_t len;
  return decode_utf8_at(s, p, &len);
}

// Start of the whitespace run that ends at `end`.
size_t whitespace_run_start(std::string_view s, size_t end) {
  size_t p = end;
  while (p > 0) {
    size_t q = p - 1;
    while (q > 0 && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
    size_t len;
    if (!is_unicode_whitespace(decode_utf8_at(s, q, &len))) break;
    p = q;
  }
  return p;
}

// End of the whitespace run that starts at `begin`.
size_t whitespace_run_end(std::string_view s, size_t begin) {
  size_t p = begin;
  while (p < s.size()) {
    size_t len;
    if (!is_unicode_whitespace(decode_utf8_at(s, p, &len))) break;
    p += len;
  }
  return p;
}

}  // namespace

int32_t AddedVocab::Matcher::child(int32_t node, unsigned char b) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), b,
                             [](const auto& e, unsigned char v) { return e.first < v; });
  return (it != ch.end() && it->first == b) ? it->second : -1;
}

void AddedVocab::Matcher::add(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  int32_t node = 0;
  for (unsigned char b : pattern) {
    int32_t c = child(node, b);
    if (c < 0) {
      c = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      auto& ch = nodes_[node].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), b,
                                 [](const auto& e, unsigned char v) { return e.first < v; });
      ch.insert(it, {b, c});
    }
    node = c;
  }
  // The first pattern registered for a given content wins (HF's pattern order).
  if (nodes_[node].token < 0) nodes_[node].token = token_index;
}

bool AddedVocab::Matcher::find(std::string_view text, size_t from, size_t* start, size_t* end,
                               int32_t* tok) const {
  for (size_t p = from; p < text.size(); ++p) {
    if (!first_byte_[static_cast<unsigned char>(text[p])]) continue;
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t q = p; q < text.size(); ++q) {
      node = child(node, static_cast<unsigned char>(text[q]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = q + 1;
      }
    }
    if (best >= 0) {
      *start = p;
      *end = best_end;
      *tok = best;
      return true;
    }
  }
  return false;
}

AddedVocab::AddedVocab(const JsonNode& node, const Normalizer* normalizer,
                       const BpeModel& model) {
  if (node.is_null()) return;
  node.require_array();
  const int64_t model_entries = static_cast<int64_t>(model.entry_count());
  std::vector<std::string> special_order, classic_order;  // contents, registration order
  for (size_t i = 0; i < node.size(); ++i) {
    JsonNode t = node[i];
    t.require_object();
    AddedToken tok;
    t.at("id").token_id();  // validated, but the effective id is assigned below (see header)
    tok.content = t.at("content").str();
    tok.single_word = t.bool_or("single_word", false);
    tok.lstrip = t.bool_or("lstrip", false);
    tok.rstrip = t.bool_or("rstrip", false);
    tok.special = t.bool_or("special", false);
    // HF's default: special tokens are not normalized, others are.
    tok.normalized = t.bool_or("normalized", !tok.special);
    if (tok.content.empty()) continue;  // HF ignores empty tokens
    // An identical token (all fields) already registered is ignored, as in HF. Looked up by
    // content so that files with very many added tokens load in linear time.
    bool duplicate = false;
    if (auto it = by_content_.find(tok.content); it != by_content_.end()) {
      auto at = by_id_.find(it->second);
      if (at != by_id_.end()) {
        const AddedToken& o = tokens_[at->second];
        duplicate = o.content == tok.content && o.special == tok.special &&
                    o.lstrip == tok.lstrip && o.rstrip == tok.rstrip &&
                    o.single_word == tok.single_word && o.normalized == tok.normalized;
      }
    }
    if (tok.special && !special_content_.count(tok.content)) {
      special_content_.insert(tok.content);
      special_order.push_back(tok.content);
    }
    if (duplicate) continue;
    int64_t id;
    if (auto it = by_content_.find(tok.content); it != by_content_.end()) {
      id = it->second;
    } else if (auto mid = model.token_to_id(tok.content)) {
      id = *mid;
    } else if (max_id_ < 0) {
      id = model_entries;
    } else {
      id = (max_id_ >= model_entries || model_entries == 0) ? max_id_ + 1 : model_entries;
    }
    if (id > INT32_MAX) t.fail_here("too many added tokens");
    tok.id = static_cast<int32_t>(id);
    max_id_ = std::max(max_id_, tok.id);
    by_id_[tok.id] = tokens_.size();
    by_content_.insert_or_assign(tok.content, tok.id);
    if (!special_content_.count(tok.content)) classic_order.push_back(tok.content);
    tokens_.push_back(std::move(tok));
  }
  // The matchers hold special tokens first, then the others (HF's pattern order; with equal
  // content the first registered wins). A pattern's flags are those of the token its id
  // resolves to, as HF looks them up by id at match time.
  auto register_token = [&](const std::string& content) {
    auto id = by_content_.find(content);
    if (id == by_content_.end()) return;
    const size_t resolved = by_id_.at(id->second);
    // `normalized` is taken from the token registered under the id, as HF does.
    if (!tokens_[resolved].normalized) {
      raw_matcher_.add(content, static_cast<int32_t>(resolved));
    } else if (normalizer) {
      normalized_matcher_.add(normalizer->normalize(content), static_cast<int32_t>(resolved));
    } else {
      normalized_matcher_.add(content, static_cast<int32_t>(resolved));
    }
  };
  for (const std::string& c : special_order) register_token(c);
  for (const std::string& c : classic_order) register_token(c);
}

bool AddedVocab::is_special_id(int32_t id) const {
  const AddedToken* t = by_id(id);
  return t && is_special_content(t->content);
}

bool AddedVocab::is_special_content(std::string_view content) const {
  return !special_content_.empty() && special_content_.find(content) != special_content_.end();
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocab::id_of(std::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

void AddedVocab::split_with(const Matcher& m, std::string&& text, std::vector<Segment>& out) const {
  if (m.empty()) {
    if (!text.empty()) out.push_back({std::move(text), -1});
    return;
  }
  // Mirrors HF AddedVocabulary::find_matches, including that a discarded single_word match
  // still consumes its bytes for the search and that rstrip may overlap the next match.
  const std::string_view s(text);
  size_t start_offset = 0;
  size_t from = 0;
  size_t b, e;
  int32_t ti;
  while (m.find(s, from, &b, &e, &ti)) {
    from = e;
    const AddedToken& tok = tokens_[ti];
    size_t start = b, stop = e;
    if (tok.single_word) {
      bool start_space = start == 0 || !is_word_char(last_char(s, start));
      size_t len;
      bool stop_space = stop == s.size() || !is_word_char(decode_utf8_at(s, stop, &len));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) start = std::max(whitespace_run_start(s, start), start_offset);
    if (tok.rstrip) stop = whitespace_run_end(s, stop);
    if (start_offset < start) out.push_back({std::string(s.substr(start_offset, start - start_offset)), -1});
    out.push_back({std::string(), tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({std::string(s.substr(start_offset)), -1});
}

void AddedVocab::split(std::string_view text, const Normalizer* normalizer,
                       std::vector<Segment>& out) const {
  std::vector<Segment> raw;
  split_with(raw_matcher_, std::string(text), raw);
  for (Segment& seg : raw) {
    if (seg.id >= 0) {
      out.push_back(std::move(seg));
      continue;
    }
    std::string norm = normalizer ? normalizer->normalize(seg.text) : std::move(seg.text);
    split_with(normalized_matcher_, std::move(norm), out);
  }
}

}  // namespace perry::tokenizer
