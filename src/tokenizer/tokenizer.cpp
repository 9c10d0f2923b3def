#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_node.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace perry::tokenizer {

struct Tokenizer::Impl {
  std::string origin;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocab added;

  // The string HF's decode sees for `id`, or nullptr when the id is skipped (unknown id, or a
  // special token under skip_special_tokens).
  const std::string* token_for_decode(int32_t id, bool skip_special) const {
    const AddedToken* t = added.by_id(id);
    const std::string* s = t ? &t->content : model->id_to_token(id);
    // HF skips by content: any token whose text is a special token's text.
    if (s && skip_special && added.is_special_content(*s)) return nullptr;
    return s;
  }

  // Appends the raw bytes of one decoded token; `first` tracks the separator HF inserts
  // between tokens when there is no decoder.
  bool append_token_bytes(int32_t id, bool skip_special, bool* first, std::string& out) const {
    const std::string* tok = token_for_decode(id, skip_special);
    if (!tok) return false;
    if (decoder) {
      decoder->decode_token(*tok, out);
    } else {
      if (!*first) out.push_back(' ');
      out += *tok;
    }
    *first = false;
    return true;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  return from_json(read_text_file(tokenizer_json_path), tokenizer_json_path);
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text.begin(), json_text.end());
  } catch (const nlohmann::json::exception& e) {
    perry::fail("{}: not valid JSON: {}", origin, e.what());
  }
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  try {
    JsonNode root(j, "$", impl->origin);
    root.require_object();
    // truncation / padding are batch-encoding options of the HF API; perry's encode returns
    // the full sequence, so they are deliberately not applied.
    if (auto n = root.find("normalizer")) impl->normalizer = make_normalizer(*n);
    if (auto n = root.find("pre_tokenizer")) impl->pre_tokenizer = make_pre_tokenizer(*n);
    impl->model = std::make_unique<BpeModel>(root.at("model"));
    if (auto n = root.find("post_processor")) impl->post_processor = make_post_processor(*n);
    if (auto n = root.find("decoder")) impl->decoder = make_decoder(*n);
    if (auto n = root.find("added_tokens")) impl->added = AddedVocab(*n, impl->normalizer.get(), *impl->model);
  } catch (const nlohmann::json::exception& e) {
    // Any type mismatch that slipped past JsonNode's checks still names the file.
    perry::fail("{}: malformed tokenizer.json: {}", origin, e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (auto bad = find_invalid_utf8(text)) {
    perry::fail("tokenizer encode: input is not valid UTF-8 at byte offset {} (byte 0x{:02X})",
                *bad, static_cast<unsigned char>(text[*bad]));
  }
  const Impl& im = *impl_;
  std::vector<Segment> segments;
  im.added.split(text, im.normalizer.get(), segments);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> pieces;
  for (Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    pieces.clear();
    pieces.push_back(std::move(seg.text));
    if (im.pre_tokenizer) im.pre_tokenizer->pre_tokenize(pieces);
    for (const std::string& p : pieces) im.model->tokenize(p, ids);
  }
  if (im.post_processor) im.post_processor->process(ids, add_special_tokens);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) impl_->append_token_bytes(id, skip_special_tokens, &first, bytes);
  std::string out;
  out.reserve(bytes.size());
  append_utf8_lossy(bytes, out);
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (const AddedToken* t = impl_->added.by_id(id)) return t->content;
  if (const std::string* s = impl_->model->id_to_token(id)) return *s;
  perry::fail("token id {} is not in the vocabulary of {} (vocab_size {})", id, impl_->origin,
              vocab_size());
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token_text) const {
  if (auto id = impl_->added.id_of(token_text)) return id;
  return impl_->model->token_to_id(token_text);
}

int32_t Tokenizer::vocab_size() const {
  return std::max(impl_->model->max_id(), impl_->added.max_id()) + 1;
}

bool Tokenizer::is_special(int32_t id) const {
  return impl_->added.is_special_id(id);
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  if (!tok_->impl().append_token_bytes(id, skip_special_, &first_, pending_)) return {};
  // Emit every complete character (and a U+FFFD for every definitely-invalid subpart, exactly
  // where a full decode would put it); keep an incomplete tail for the next token.
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    Utf8Step st = utf8_step(std::string_view(pending_).substr(i));
    if (st.status == Utf8Status::kIncomplete) break;
    if (st.status == Utf8Status::kValid) {
      out.append(pending_, i, st.len);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += st.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  append_utf8_lossy(pending_, out);
  pending_.clear();
  return out;
}

}  // namespace perry::tokenizer
