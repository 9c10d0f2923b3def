#include "tokenizer/decoder.h"

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace perry::tokenizer {

namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_token(std::string_view token, std::string& out) const override {
    // Each char maps back to one byte; a token with any char outside the table (e.g. an added
    // token written in plain UTF-8) is taken verbatim, as HF does.
    const size_t mark = out.size();
    size_t i = 0;
    while (i < token.size()) {
      Utf8Step st = utf8_step(token.substr(i));
      int b = -1;
      if (st.status == Utf8Status::kValid) {
        size_t len;
        b = byte_level_byte(decode_utf8_at(token, i, &len));
      }
      if (b < 0) {
        out.resize(mark);
        out.append(token);
        return;
      }
      out.push_back(static_cast<char>(b));
      i += st.len;
    }
  }
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_token(std::string_view token, std::string& out) const override {
    std::string cur(token), next;
    for (const auto& p : parts_) {
      next.clear();
      p->decode_token(cur, next);
      std::swap(cur, next);
    }
    out += cur;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const JsonNode& node) {
  if (node.is_null()) return nullptr;
  JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Sequence") {
    JsonNode list = node.at("decoders");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      JsonNode item = list[i];
      if (item.is_null()) item.fail_here("expected a decoder object, got null");
      parts.push_back(make_decoder(item));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  type_node.fail_here("unsupported decoder type \"{}\" (supported: ByteLevel, Sequence)", type);
}

}  // namespace perry::tokenizer
