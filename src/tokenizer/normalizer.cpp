#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

namespace perry::tokenizer {

namespace {

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}

  std::string normalize(std::string_view text) const override {
    // Pure ASCII is invariant under every normal form; skipping utf8proc here keeps the common
    // case (code, English) free of an allocation and a table walk.
    bool ascii = true;
    for (char c : text) {
      if (static_cast<unsigned char>(c) >= 0x80) {
        ascii = false;
        break;
      }
    }
    if (ascii) return std::string(text);
    int options = UTF8PROC_STABLE;
    switch (form_) {
      case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
      case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
      case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                      static_cast<utf8proc_ssize_t>(text.size()), &out,
                                      static_cast<utf8proc_option_t>(options));
    if (n < 0) {
      perry::fail("unicode normalization failed: {}", utf8proc_errmsg(n));
    }
    std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

 private:
  NormalForm form_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& p : parts_) s = p->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const JsonNode& node) {
  if (node.is_null()) return nullptr;
  const std::string type = node.at("type").str();
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFKD);
  if (type == "Sequence") {
    JsonNode list = node.at("normalizers");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto n = make_normalizer(list[i])) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  node.at("type").fail_here("unsupported normalizer type \"{}\" (supported: NFC, NFD, NFKC, NFKD, "
                            "Sequence)", type);
}

}  // namespace perry::tokenizer
