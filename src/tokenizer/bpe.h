// The BPE model (HF "model": {"type": "BPE"}): vocab, ranked merges, ignore_merges, unk and
// byte-fallback handling, and a per-pre-token result cache (pre-tokens repeat a lot in real
// text, so most lookups skip the merge loop entirely).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_node.h"

namespace perry::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `node` is the "model" object; throws perry::Error naming the JSON path on bad content.
  explicit BpeModel(const JsonNode& node);

  // Appends the ids of one pre-token (already in the model's alphabet, e.g. byte-level chars).
  void tokenize(const std::string& piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id has no vocab entry
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  size_t entry_count() const { return vocab_.size(); }  // HF's model vocab size

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(const std::string& piece, std::vector<int32_t>& out) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  // Cache of pre-token → ids. Bounded: cleared when it grows past kMaxCacheEntries so a long
  // stream of unique strings cannot grow memory without limit.
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  static constexpr size_t kMaxCachedPieceBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace perry::tokenizer
