#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "core/error.h"

namespace perry::tokenizer {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread scratch: PCRE2 match data and a JIT stack large enough for long whitespace or
// letter runs (the default 32 KiB can overflow on megabyte-long inputs).
struct MatchScratch {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  MatchScratch() {
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

size_t next_char_len(std::string_view s, size_t pos) {
  const auto b = static_cast<unsigned char>(s[pos]);
  size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  return std::min(n, s.size() - pos);
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // PCRE2 rejects UCP together with LITERAL (it has no classes to apply it to).
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &err_off, nullptr);
  if (!code) {
    perry::fail("invalid regex /{}/ at offset {}: {}", pattern, err_off, pcre2_message(err));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (pos <= text.size()) {
    // The text was validated once up front; rechecking per call would be quadratic.
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.md, s.ctx)
                  : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.md, s.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) perry::fail("regex match failed: {}", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    size_t b = ov[0], e = ov[1];
    if (e < b || e > text.size()) perry::fail("regex produced an invalid match range");
    if (b == e && have_last && last_end == e) {
      if (pos >= text.size()) break;
      pos += next_char_len(text, pos);
      continue;
    }
    out.emplace_back(b, e);
    have_last = true;
    last_end = e;
    pos = e;
  }
}

}  // namespace perry::tokenizer
