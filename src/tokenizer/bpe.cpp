#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <queue>

#include "tokenizer/utf8.h"

namespace perry::tokenizer {

namespace {

// Rejects model options perry does not implement instead of silently tokenizing differently.
void require_empty_or_null(const JsonNode& model, std::string_view key) {
  if (auto n = model.find(key)) {
    if (!n->str().empty()) n->fail_here("non-empty {} is not supported", key);
  }
}

}  // namespace

BpeModel::BpeModel(const JsonNode& node) {
  node.require_object();
  if (auto t = node.find("type"); t && t->str() != "BPE") {
    t->fail_here("unsupported model type \"{}\" (supported: BPE)", t->str());
  }
  if (auto d = node.find("dropout")) {
    if (!d->raw().is_number()) d->fail_here("expected a number or null");
    if (d->raw().get<double>() != 0.0) d->fail_here("BPE dropout is not supported (it is random)");
  }
  require_empty_or_null(node, "continuing_subword_prefix");
  require_empty_or_null(node, "end_of_word_suffix");
  fuse_unk_ = node.bool_or("fuse_unk", false);
  byte_fallback_ = node.bool_or("byte_fallback", false);
  ignore_merges_ = node.bool_or("ignore_merges", false);

  JsonNode vocab = node.at("vocab");
  vocab.require_object();
  vocab_.reserve(vocab.raw().size());
  int32_t max_id = -1;
  for (auto it = vocab.raw().begin(); it != vocab.raw().end(); ++it) {
    JsonNode v(it.value(), vocab.path() + "[\"" + it.key() + "\"]", node.origin());
    int32_t id = v.token_id();
    vocab_.insert_or_assign(it.key(), id);
    max_id = std::max(max_id, id);
  }
  if (max_id >= (1 << 26)) vocab.fail_here("token id {} is implausibly large", max_id);
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_token_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : vocab_) {
    id_to_token_[id] = tok;
    has_token_[id] = true;
  }

  if (auto unk = node.find("unk_token")) {
    auto it = vocab_.find(unk->str());
    if (it == vocab_.end()) unk->fail_here("unk_token \"{}\" is not in the vocab", unk->str());
    unk_id_ = it->second;
  }

  JsonNode merges = node.at("merges");
  merges_.reserve(merges.size());
  std::string a, b;
  for (size_t i = 0; i < merges.size(); ++i) {
    JsonNode m = merges[i];
    if (m.is_string()) {
      // Legacy form "a b": the first space separates the pair.
      const std::string s = m.str();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) m.fail_here("merge \"{}\" is not of the form \"a b\"", s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array()) {
      if (m.size() != 2) m.fail_here("merge must be a pair [a, b], has {} elements", m.size());
      a = m[0].str();
      b = m[1].str();
    } else {
      m.fail_here("merge must be a string \"a b\" or a pair [a, b], got {}", m.raw().type_name());
    }
    auto ia = vocab_.find(a);
    auto ib = vocab_.find(b);
    auto inew = vocab_.find(a + b);
    if (ia == vocab_.end()) m.fail_here("merge token \"{}\" is not in the vocab", a);
    if (ib == vocab_.end()) m.fail_here("merge token \"{}\" is not in the vocab", b);
    if (inew == vocab_.end()) m.fail_here("merged token \"{}\" is not in the vocab", a + b);
    // A repeated pair takes the later rank, as HF's map construction does.
    merges_.insert_or_assign(pair_key(ia->second, ib->second),
                             Merge{static_cast<int32_t>(i), inew->second});
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::tokenize(const std::string& piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    // A pre-token that is itself a vocab entry is emitted whole, even when the merge order
    // would have produced a different split (Llama-3).
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(piece, std::move(ids));
  }
}

void BpeModel::merge_word(const std::string& w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(w.size());
  auto add = [&](int32_t id) {
    int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({id, idx - 1, -1, true});
    if (idx > 0) syms[idx - 1].next = idx;
  };

  // Characters → initial symbols (HF BPE::merge_word, including its unk/byte-fallback rules).
  int32_t pending_unk = -1;  // an unk symbol not yet added (fuse_unk grows it)
  size_t i = 0;
  while (i < w.size()) {
    size_t len = std::min(utf8_step(std::string_view(w).substr(i)).len, w.size() - i);
    std::string_view ch(w.data() + i, len);
    i += len;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (unsigned char c : ch) {
        auto bt = vocab_.find(fmt::format("<0x{:02X}>", c));
        if (bt == vocab_.end()) break;
        bytes.push_back(bt->second);
      }
      if (bytes.size() == ch.size()) {
        for (int32_t b : bytes) add(b);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unk token an unknown character is dropped, as in HF.
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int32_t pos) {
    if (pos < 0) return;
    int32_t nxt = syms[pos].next;
    if (nxt < 0) return;
    auto m = merges_.find(pair_key(syms[pos].id, syms[nxt].id));
    if (m != merges_.end()) queue.push({m->second.rank, pos, m->second.new_id});
  };
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(syms.size()); ++p) push_pair(p);

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = syms[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = syms[left.next];
    // Stale entry: the pair at this position changed since it was queued.
    auto m = merges_.find(pair_key(left.id, right.id));
    if (m == merges_.end() || m->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : syms) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace perry::tokenizer
