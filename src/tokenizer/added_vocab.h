// Added tokens (HF "added_tokens"): special and non-special tokens matched in the raw text
// before any normalization or BPE, with HF's leftmost-longest matching and its lstrip / rstrip
// / single_word / normalized rules.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/json_node.h"

namespace perry::tokenizer {

class Normalizer;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A piece of input text: either plain text still to be tokenized (id < 0) or an added token.
struct Segment {
  std::string text;
  int32_t id = -1;
};

class AddedVocab {
 public:
  AddedVocab() = default;
  // `node` is the "added_tokens" array (or null). The normalizer is needed because tokens with
  // normalized=true are matched against the normalized text in their normalized form.
  //
  // Ids are assigned the way HF does when it loads a file, not copied from the "id" fields: a
  // token whose content is in the model vocab takes that id, any other the next free id after
  // the model vocab (entry count) and the added tokens so far. For every consistent file
  // (Qwen, Llama-3) this equals the stored id; where a file disagrees, HF only warns and uses
  // its own id, so perry does the same to stay token-for-token identical.
  AddedVocab(const JsonNode& node, const Normalizer* normalizer, const BpeModel& model);

  // Splits `text` into segments: first on non-normalized tokens over the raw text, then each
  // remaining piece is normalized and split on the normalized tokens.
  void split(std::string_view text, const Normalizer* normalizer, std::vector<Segment>& out) const;

  const AddedToken* by_id(int32_t id) const;
  // HF decides "special" by content: a content ever added with special=true is special.
  bool is_special_id(int32_t id) const;
  bool is_special_content(std::string_view content) const;
  std::optional<int32_t> id_of(std::string_view content) const;
  int32_t max_id() const { return max_id_; }

 private:
  // Byte trie with leftmost-longest search (what HF's Aho-Corasick with LeftmostLongest gives).
  class Matcher {
   public:
    void add(std::string_view pattern, int32_t token_index);
    bool empty() const { return nodes_.size() <= 1; }
    // Earliest match at or after `from`, longest at that start: {start, end, token_index}.
    bool find(std::string_view text, size_t from, size_t* start, size_t* end, int32_t* tok) const;

   private:
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
      int32_t token = -1;
    };
    int32_t child(int32_t node, unsigned char b) const;
    std::vector<Node> nodes_{Node{}};
    bool first_byte_[256] = {};
  };

  void split_with(const Matcher& m, std::string&& text, std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;                // every accepted token, in file order
  std::unordered_map<int32_t, size_t> by_id_;     // id → index in tokens_ (latest wins)
  StringIdMap by_content_;                        // content → id
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_content_;
  Matcher raw_matcher_;
  Matcher normalized_matcher_;
  int32_t max_id_ = -1;
};

}  // namespace perry::tokenizer
