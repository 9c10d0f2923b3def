// Lexer: HF's template preprocessing (lstrip_blocks, trim_blocks, generation tags) followed by the
// tokenizer proper. Every preprocessed byte remembers its offset in the original source so errors
// can name a line and column the author recognises.
#include <cstring>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace perry::tokenizer::jinja {

void syntax_error(std::string_view source, size_t pos, const std::string& msg) {
  if (pos > source.size()) pos = source.size();
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos;) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
      ++i;
    } else {
      next_code_point(source, i);
      ++col;
    }
  }
  fail("chat template syntax error at line {}, column {}: {}", line, col, msg);
}

namespace {

// Text plus, for each byte, its offset in the original template.
struct Mapped {
  std::string s;
  std::vector<size_t> pos;
  void push(char c, size_t p) {
    s += c;
    pos.push_back(p);
  }
};

bool line_terminator_before(const Mapped& m, size_t i) {
  if (i == 0) return true;
  const char c = m.s[i - 1];
  if (c == '\n' || c == '\r') return true;
  // U+2028 / U+2029 end lines for JS's multiline `^` too.
  return i >= 3 && (std::memcmp(m.s.data() + i - 3, "\xE2\x80\xA8", 3) == 0 ||
                    std::memcmp(m.s.data() + i - 3, "\xE2\x80\xA9", 3) == 0);
}

// Length of the JS whitespace code point at s[i], 0 if none.
bool is_tag_mark(char c) { return c == '#' || c == '%' || c == '-'; }

size_t space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t j = i;
  return is_js_space(next_code_point(s, j)) ? j - i : 0;
}

Mapped preprocess(std::string_view src) {
  Mapped in;
  for (size_t i = 0; i < src.size(); ++i) in.push(src[i], i);
  if (!in.s.empty() && in.s.back() == '\n') {
    in.s.pop_back();
    in.pos.pop_back();
  }
  // lstrip_blocks: /^[ \t]*({[#%-])/gm → drop the indentation before a block or comment tag.
  Mapped a;
  for (size_t i = 0; i < in.s.size();) {
    if (line_terminator_before(in, i)) {
      size_t j = i;
      while (j < in.s.size() && (in.s[j] == ' ' || in.s[j] == '\t')) ++j;
      if (j + 1 < in.s.size() && in.s[j] == '{' && is_tag_mark(in.s[j + 1])) i = j;
    }
    a.push(in.s[i], in.pos[i]);
    ++i;
  }
  // trim_blocks: /([#%-]})\n/g → drop the newline right after a block or comment tag.
  Mapped b;
  for (size_t i = 0; i < a.s.size();) {
    if (i + 2 < a.s.size() && is_tag_mark(a.s[i]) && a.s[i + 1] == '}' &&
        a.s[i + 2] == '\n') {
      b.push(a.s[i], a.pos[i]);
      b.push(a.s[i + 1], a.pos[i + 1]);
      i += 3;
      continue;
    }
    b.push(a.s[i], a.pos[i]);
    ++i;
  }
  // {% generation %} / {% endgeneration %} (assistant-mask markers) vanish, honouring their `-`.
  Mapped c;
  size_t protected_len = 0;  // output before this was consumed by an earlier match
  for (size_t i = 0; i < b.s.size();) {
    if (b.s.compare(i, 2, "{%") == 0) {
      size_t q = i + 2;
      const bool lstrip = q < b.s.size() && b.s[q] == '-';
      if (lstrip) ++q;
      while (size_t n = space_at(b.s, q)) q += n;
      if (b.s.compare(q, 3, "end") == 0 && b.s.compare(q + 3, 10, "generation") == 0) q += 3;
      if (b.s.compare(q, 10, "generation") == 0) {
        q += 10;
        while (size_t n = space_at(b.s, q)) q += n;
        const bool rstrip = q < b.s.size() && b.s[q] == '-';
        if (rstrip) ++q;
        if (b.s.compare(q, 2, "%}") == 0) {
          q += 2;
          if (lstrip) {
            std::string tail = js_trim(std::string_view(c.s).substr(protected_len), false, true);
            c.s.resize(protected_len + tail.size());
            c.pos.resize(c.s.size());
          }
          size_t after = q;
          while (size_t n = space_at(b.s, after)) after += n;
          if (!rstrip)
            for (size_t k = q; k < after; ++k) c.push(b.s[k], b.pos[k]);
          protected_len = c.s.size();
          i = after;
          continue;
        }
      }
    }
    c.push(b.s[i], b.pos[i]);
    ++i;
  }
  return c;
}

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

struct Lexer {
  std::string_view source;  // original, for error positions
  Mapped m;
  size_t cur = 0;
  Lexed out;

  size_t orig(size_t i) const { return i < m.pos.size() ? m.pos[i] : source.size(); }
  [[noreturn]] void error(size_t at, const std::string& msg) const { syntax_error(source, orig(at), msg); }
  char at(size_t i) const { return i < m.s.size() ? m.s[i] : '\0'; }
  bool starts(std::string_view p) const { return m.s.compare(cur, p.size(), p) == 0; }
  Tok last() const { return out.tokens.back().type; }
  void push(Tok t, std::string v, size_t p) { out.tokens.push_back({t, std::move(v), orig(p)}); }

  void strip_trailing_whitespace() {
    if (!out.tokens.empty() && last() == Tok::Text) {
      auto& t = out.tokens.back();
      t.value = js_trim(t.value, false, true);
      if (t.value.empty()) out.tokens.pop_back();
    }
  }
  void skip_leading_whitespace() {
    while (size_t n = space_at(m.s, cur)) cur += n;
  }

  // A quoted string body up to `quote` with the reference's escapes; cur is past the opening quote.
  std::string read_string(char quote, size_t start) {
    std::string str;
    while (true) {
      if (cur >= m.s.size()) error(start, "unterminated string literal");
      const char ch = m.s[cur];
      if (ch == quote) break;
      if (ch == '\\') {
        ++cur;
        if (cur >= m.s.size()) error(start, "unterminated string literal");
        const char e = m.s[cur++];
        if (e == 'x' || e == 'u') {
          const size_t len = e == 'x' ? 2 : 4;
          if (cur + len > m.s.size()) error(cur - 2, "invalid hexadecimal escape sequence");
          char32_t cp = 0;
          for (size_t k = 0; k < len; ++k) {
            const char h = m.s[cur + k];
            const int d = is_digit(h) ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
            if (d < 0) error(cur - 2, "invalid hexadecimal escape sequence");
            cp = cp * 16 + d;
          }
          cur += len;
          // A \uD83D\uDE00 surrogate pair is one character in the JS string it came from.
          if (cp >= 0xD800 && cp <= 0xDBFF && m.s.compare(cur, 2, "\\u") == 0 && cur + 6 <= m.s.size()) {
            char32_t lo = 0;
            bool ok = true;
            for (size_t k = 0; k < 4; ++k) {
              const char h = m.s[cur + 2 + k];
              const int d = is_digit(h) ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
              ok = ok && d >= 0;
              lo = lo * 16 + (d < 0 ? 0 : d);
            }
            if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              cur += 6;
            }
          }
          append_utf8(str, cp);
          continue;
        }
        switch (e) {
          case 'n': str += '\n'; break;
          case 't': str += '\t'; break;
          case 'r': str += '\r'; break;
          case 'b': str += '\b'; break;
          case 'f': str += '\f'; break;
          case 'v': str += '\v'; break;
          case '\'': str += '\''; break;
          case '"': str += '"'; break;
          case '\\': str += '\\'; break;
          default: error(cur - 2, std::string("unexpected escaped character: ") + e);
        }
        continue;
      }
      str += ch;
      ++cur;
    }
    ++cur;  // closing quote
    return str;
  }

  std::string read_digits() {
    const size_t b = cur;
    while (is_digit(at(cur))) ++cur;
    return m.s.substr(b, cur - b);
  }

  void run() {
    static const std::pair<const char*, Tok> table[] = {
        {"{%", Tok::OpenStmt}, {"%}", Tok::CloseStmt}, {"{{", Tok::OpenExpr}, {"}}", Tok::CloseExpr},
        {"(", Tok::LParen},    {")", Tok::RParen},     {"{", Tok::LBrace},    {"}", Tok::RBrace},
        {"[", Tok::LBracket},  {"]", Tok::RBracket},   {",", Tok::Comma},     {".", Tok::Dot},
        {":", Tok::Colon},     {"|", Tok::Pipe},       {"<=", Tok::Comparison}, {">=", Tok::Comparison},
        {"==", Tok::Comparison}, {"!=", Tok::Comparison}, {"<", Tok::Comparison}, {">", Tok::Comparison},
        {"+", Tok::Additive},  {"-", Tok::Additive},   {"~", Tok::Additive},  {"**", Tok::Power},
        {"*", Tok::Multiplicative}, {"//", Tok::Multiplicative}, {"/", Tok::Multiplicative},
        {"%", Tok::Multiplicative}, {"=", Tok::Equals}};
    int curly_depth = 0;
    const size_t n = m.s.size();
    while (cur < n) {
      const bool text_mode = out.tokens.empty() || last() == Tok::CloseStmt || last() == Tok::CloseExpr ||
                             last() == Tok::Comment;
      if (text_mode) {
        const size_t b = cur;
        while (cur < n && !(m.s[cur] == '{' && (at(cur + 1) == '%' || at(cur + 1) == '{' || at(cur + 1) == '#')))
          ++cur;
        if (cur > b) {
          push(Tok::Text, m.s.substr(b, cur - b), b);
          continue;
        }
      }
      if (starts("{#")) {
        const size_t b = cur;
        cur += 2;
        const bool strip_before = at(cur) == '-';
        if (strip_before) ++cur;
        const size_t cb = cur;
        while (!(at(cur) == '#' && at(cur + 1) == '}')) {
          if (cur + 2 >= n) error(b, "missing end of comment tag '#}'");
          ++cur;
        }
        std::string comment = m.s.substr(cb, cur - cb);
        const bool strip_after = !comment.empty() && comment.back() == '-';
        if (strip_after) comment.pop_back();
        if (strip_before) strip_trailing_whitespace();
        push(Tok::Comment, std::move(comment), b);
        cur += 2;
        if (strip_after) skip_leading_whitespace();
        continue;
      }
      if (starts("{%-")) {
        strip_trailing_whitespace();
        push(Tok::OpenStmt, "{%", cur);
        cur += 3;
        continue;
      }
      if (starts("{{-")) {
        strip_trailing_whitespace();
        push(Tok::OpenExpr, "{{", cur);
        curly_depth = 0;
        cur += 3;
        continue;
      }
      // Whitespace inside a tag; running off the end here is an unterminated tag.
      while (size_t w = space_at(m.s, cur)) {
        cur += w;
        if (cur >= n) error(cur, "unexpected end of template inside a tag (missing '%}' or '}}')");
      }
      if (starts("-%}")) {
        push(Tok::CloseStmt, "%}", cur);
        cur += 3;
        skip_leading_whitespace();
        continue;
      }
      if (starts("-}}")) {
        push(Tok::CloseExpr, "}}", cur);
        cur += 3;
        skip_leading_whitespace();
        continue;
      }
      const char ch = m.s[cur];
      if (ch == '-' || ch == '+') {
        if (out.tokens.empty() || last() == Tok::Text) error(cur, std::string("unexpected character: ") + ch);
        const Tok lt = last();
        if (!(lt == Tok::Ident || lt == Tok::Number || lt == Tok::String || lt == Tok::RParen ||
              lt == Tok::RBracket)) {
          const size_t b = cur;
          ++cur;  // a sign: part of a number literal or a unary operator
          std::string num = read_digits();
          if (!num.empty() && at(cur) == '.' && is_digit(at(cur + 1))) {
            ++cur;
            num += '.';
            num += read_digits();
          }
          if (num.empty())
            push(Tok::Unary, std::string(1, ch), b);
          else
            push(Tok::Number, num.insert(0, 1, ch), b);
          continue;
        }
      }
      bool matched = false;
      for (const auto& [seq, type] : table) {
        if (type == Tok::CloseExpr && curly_depth > 0) continue;
        if (!starts(seq)) continue;
        push(type, seq, cur);
        if (type == Tok::OpenExpr) curly_depth = 0;
        if (type == Tok::LBrace) ++curly_depth;
        if (type == Tok::RBrace) --curly_depth;
        cur += std::strlen(seq);
        matched = true;
        break;
      }
      if (matched) continue;
      if (ch == '\'' || ch == '"') {
        const size_t b = cur;
        ++cur;
        std::string s = read_string(ch, b);
        push(Tok::String, std::move(s), b);
        continue;
      }
      if (is_digit(ch)) {
        const size_t b = cur;
        std::string num = read_digits();
        if (last() != Tok::Dot && at(cur) == '.' && is_digit(at(cur + 1))) {
          ++cur;
          num += '.';
            num += read_digits();
        }
        push(Tok::Number, std::move(num), b);
        continue;
      }
      if (is_word(ch)) {
        const size_t b = cur;
        while (is_word(at(cur))) ++cur;
        push(Tok::Ident, m.s.substr(b, cur - b), b);
        continue;
      }
      size_t j = cur;
      next_code_point(m.s, j);
      error(cur, "unexpected character: '" + m.s.substr(cur, j - cur) + "'");
    }
  }
};

}  // namespace

Lexed tokenize(std::string_view source) {
  Lexer lx{source, preprocess(source), 0, {}};
  lx.out.end_pos = source.size();
  lx.run();
  return std::move(lx.out);
}

}  // namespace perry::tokenizer::jinja
