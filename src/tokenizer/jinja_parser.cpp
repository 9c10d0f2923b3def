// Recursive-descent parser. Precedence, loosest first (as in the reference renderer):
//   a if b else c → or → and → not → comparisons / in / not in → + - ~ → * / // % → ** → is (tests)
//   → | (filters) → unary sign → calls, attributes, subscripts → atoms.
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"

namespace perry::tokenizer::jinja {

namespace {

class Parser {
 public:
  Parser(const Lexed& lx, std::string_view src) : t_(lx.tokens), end_pos_(lx.end_pos), src_(src) {}

  NodePtr program() {
    auto p = std::make_unique<Node>(NodeType::Program, 0);
    while (cur_ < t_.size()) p->body.push_back(any());
    return p;
  }

 private:
  const std::vector<Token>& t_;
  size_t end_pos_;
  std::string_view src_;
  size_t cur_ = 0;
  int depth_ = 0;  // nesting guard: deeply nested input must be an error, not a stack overflow

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > 200) p.error("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  size_t pos() const { return cur_ < t_.size() ? t_[cur_].pos : end_pos_; }
  [[noreturn]] void error(const std::string& msg) const { syntax_error(src_, pos(), msg); }
  bool at_end() const { return cur_ >= t_.size(); }
  bool is(Tok type, size_t k = 0) const { return cur_ + k < t_.size() && t_[cur_ + k].type == type; }
  bool is_ident(std::string_view name, size_t k = 0) const {
    return is(Tok::Ident, k) && t_[cur_ + k].value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!is(Tok::OpenStmt) || !is(Tok::Ident, 1)) return false;
    for (auto n : names)
      if (t_[cur_ + 1].value == n) return true;
    return false;
  }
  static const char* tok_name(Tok t) {
    switch (t) {
      case Tok::Text: return "text";
      case Tok::Number: return "number";
      case Tok::String: return "string";
      case Tok::Ident: return "identifier";
      case Tok::Equals: return "'='";
      case Tok::LParen: return "'('";
      case Tok::RParen: return "')'";
      case Tok::OpenStmt: return "'{%'";
      case Tok::CloseStmt: return "'%}'";
      case Tok::OpenExpr: return "'{{'";
      case Tok::CloseExpr: return "'}}'";
      case Tok::LBracket: return "'['";
      case Tok::RBracket: return "']'";
      case Tok::LBrace: return "'{'";
      case Tok::RBrace: return "'}'";
      case Tok::Comma: return "','";
      case Tok::Dot: return "'.'";
      case Tok::Colon: return "':'";
      case Tok::Pipe: return "'|'";
      default: return "operator";
    }
  }
  std::string describe_current() const {
    if (at_end()) return "end of template";
    const auto& tk = t_[cur_];
    if (tk.type == Tok::Ident || tk.type == Tok::Number || tk.type == Tok::Comparison || tk.type == Tok::Additive ||
        tk.type == Tok::Multiplicative || tk.type == Tok::Power || tk.type == Tok::Unary)
      return "'" + tk.value + "'";
    return tok_name(tk.type);
  }
  const Token& expect(Tok type, const char* what) {
    if (!is(type)) error(std::string("expected ") + what + ", got " + describe_current());
    return t_[cur_++];
  }
  void expect_ident(std::string_view name) {
    if (!is_ident(name)) error("expected '" + std::string(name) + "', got " + describe_current());
    ++cur_;
  }
  // Body statements until one of `names` opens a statement; running out names the missing end tag.
  void block_until(std::vector<NodePtr>& out, std::initializer_list<std::string_view> names, const char* end_tag) {
    while (!is_statement(names)) {
      if (at_end()) error(std::string("unexpected end of template, expected {% ") + end_tag + " %}");
      out.push_back(any());
    }
  }
  void close_tag(std::string_view end_name) {
    expect(Tok::OpenStmt, "'{%'");
    expect_ident(end_name);
    expect(Tok::CloseStmt, "'%}'");
  }

  NodePtr any() {
    DepthGuard guard(*this);
    const auto& tk = t_[cur_];
    switch (tk.type) {
      case Tok::Comment: {
        auto n = std::make_unique<Node>(NodeType::Comment, tk.pos);
        ++cur_;
        return n;
      }
      case Tok::Text: {
        auto n = std::make_unique<Node>(NodeType::StringLit, tk.pos);
        n->str = tk.value;
        ++cur_;
        return n;
      }
      case Tok::OpenStmt: return statement();
      case Tok::OpenExpr: {
        ++cur_;
        auto e = expression();
        expect(Tok::CloseExpr, "'}}'");
        return e;
      }
      default: error("unexpected " + describe_current());
    }
  }

  NodePtr statement() {
    expect(Tok::OpenStmt, "'{%'");
    if (!is(Tok::Ident)) error("expected a statement name after '{%', got " + describe_current());
    const std::string name = t_[cur_].value;
    const size_t p = pos();
    NodePtr r;
    if (name == "set") {
      ++cur_;
      r = std::make_unique<Node>(NodeType::Set, p);
      r->a = expression_sequence(false);
      if (is(Tok::Equals)) {
        ++cur_;
        r->b = expression_sequence(false);
      } else {
        expect(Tok::CloseStmt, "'%}'");
        block_until(r->body, {"endset"}, "endset");
        expect(Tok::OpenStmt, "'{%'");
        expect_ident("endset");
      }
      expect(Tok::CloseStmt, "'%}'");
    } else if (name == "if") {
      ++cur_;
      r = if_statement(p);
      close_tag("endif");
    } else if (name == "macro") {
      ++cur_;
      r = std::make_unique<Node>(NodeType::Macro, p);
      auto id = primary();
      if (id->type != NodeType::Identifier) error("expected a macro name");
      r->str = id->str;
      r->args = arguments(true);
      expect(Tok::CloseStmt, "'%}'");
      block_until(r->body, {"endmacro"}, "endmacro");
      close_tag("endmacro");
    } else if (name == "for") {
      ++cur_;
      r = std::make_unique<Node>(NodeType::For, p);
      r->a = expression_sequence(true);
      if (r->a->type != NodeType::Identifier && r->a->type != NodeType::TupleLit)
        error("expected an identifier or tuple as the loop variable");
      if (!is_ident("in")) error("expected 'in' after the loop variable, got " + describe_current());
      ++cur_;
      r->b = expression();
      expect(Tok::CloseStmt, "'%}'");
      block_until(r->body, {"endfor", "else"}, "endfor");
      if (is_statement({"else"})) {
        cur_ += 2;
        expect(Tok::CloseStmt, "'%}'");
        block_until(r->alt, {"endfor"}, "endfor");
      }
      close_tag("endfor");
    } else if (name == "call") {
      ++cur_;
      r = std::make_unique<Node>(NodeType::CallStatement, p);
      if (is(Tok::LParen)) {
        r->args = arguments(true);
        r->flag = true;
      }
      auto callee = primary();
      if (callee->type != NodeType::Identifier) error("expected a macro name after 'call'");
      auto call = std::make_unique<Node>(NodeType::Call, callee->pos);
      call->a = std::move(callee);
      call->args = arguments(false);
      r->a = std::move(call);
      expect(Tok::CloseStmt, "'%}'");
      block_until(r->body, {"endcall"}, "endcall");
      close_tag("endcall");
    } else if (name == "break" || name == "continue") {
      ++cur_;
      r = std::make_unique<Node>(name == "break" ? NodeType::Break : NodeType::Continue, p);
      expect(Tok::CloseStmt, "'%}'");
    } else if (name == "filter") {
      ++cur_;
      r = std::make_unique<Node>(NodeType::FilterStatement, p);
      r->a = primary();
      if (r->a->type == NodeType::Identifier && is(Tok::LParen)) r->a = call_expression(std::move(r->a));
      expect(Tok::CloseStmt, "'%}'");
      block_until(r->body, {"endfilter"}, "endfilter");
      close_tag("endfilter");
    } else {
      error("unknown statement '" + name + "'");
    }
    return r;
  }

  NodePtr if_statement(size_t p) {
    auto r = std::make_unique<Node>(NodeType::If, p);
    r->a = expression();
    expect(Tok::CloseStmt, "'%}'");
    block_until(r->body, {"elif", "else", "endif"}, "endif");
    if (is_statement({"elif"})) {
      const size_t ep = t_[cur_ + 1].pos;
      cur_ += 2;
      r->alt.push_back(if_statement(ep));
    } else if (is_statement({"else"})) {
      cur_ += 2;
      expect(Tok::CloseStmt, "'%}'");
      block_until(r->alt, {"endif"}, "endif");
    }
    return r;
  }

  NodePtr expression_sequence(bool primary_only) {
    const size_t p = pos();
    std::vector<NodePtr> items;
    items.push_back(primary_only ? primary() : expression());
    const bool tuple = is(Tok::Comma);
    while (tuple) {
      ++cur_;
      items.push_back(primary_only ? primary() : expression());
      if (!is(Tok::Comma)) break;
    }
    if (!tuple) return std::move(items[0]);
    auto t = std::make_unique<Node>(NodeType::TupleLit, p);
    t->args = std::move(items);
    return t;
  }

  NodePtr expression() {
    DepthGuard guard(*this);
    auto a = logical_or();
    if (is_ident("if")) {
      const size_t p = pos();
      ++cur_;
      auto test = logical_or();
      if (is_ident("else")) {
        ++cur_;
        auto n = std::make_unique<Node>(NodeType::Ternary, p);
        n->a = std::move(test);
        n->b = std::move(a);
        n->c = expression();
        return n;
      }
      auto n = std::make_unique<Node>(NodeType::Select, p);
      n->a = std::move(a);
      n->b = std::move(test);
      return n;
    }
    return a;
  }

  NodePtr binary(std::string op, size_t p, NodePtr l, NodePtr r) {
    auto n = std::make_unique<Node>(NodeType::Binary, p);
    n->str = std::move(op);
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  NodePtr logical_or() {
    auto l = logical_and();
    while (is_ident("or")) {
      const size_t p = pos();
      ++cur_;
      l = binary("or", p, std::move(l), logical_and());
    }
    return l;
  }
  NodePtr logical_and() {
    auto l = logical_not();
    while (is_ident("and")) {
      const size_t p = pos();
      ++cur_;
      l = binary("and", p, std::move(l), logical_not());
    }
    return l;
  }
  NodePtr logical_not() {
    DepthGuard guard(*this);
    // A loop, as in the reference: in `not a ** not b` the inner `not` parses as a name, and the
    // following `not b` then replaces the whole first operand.
    NodePtr right;
    while (is_ident("not")) {
      auto n = std::make_unique<Node>(NodeType::Unary, pos());
      n->str = "not";
      ++cur_;
      n->a = logical_not();
      right = std::move(n);
    }
    return right ? std::move(right) : comparison();
  }
  NodePtr comparison() {
    auto l = additive();
    while (true) {
      const size_t p = pos();
      std::string op;
      if (is_ident("not") && is_ident("in", 1)) {
        op = "not in";
        cur_ += 2;
      } else if (is_ident("in")) {
        op = "in";
        ++cur_;
      } else if (is(Tok::Comparison)) {
        op = t_[cur_++].value;
      } else {
        break;
      }
      l = binary(op, p, std::move(l), additive());
    }
    return l;
  }
  NodePtr additive() {
    auto l = multiplicative();
    while (is(Tok::Additive)) {
      const size_t p = pos();
      const std::string op = t_[cur_++].value;
      l = binary(op, p, std::move(l), multiplicative());
    }
    return l;
  }
  NodePtr multiplicative() {
    auto l = power();
    while (is(Tok::Multiplicative)) {
      const size_t p = pos();
      const std::string op = t_[cur_++].value;
      l = binary(op, p, std::move(l), power());
    }
    return l;
  }
  NodePtr power() {
    auto l = test_expression();
    while (is(Tok::Power)) {
      const size_t p = pos();
      ++cur_;
      l = binary("**", p, std::move(l), test_expression());
    }
    return l;
  }
  NodePtr test_expression() {
    auto operand = filter_expression();
    while (is_ident("is")) {
      const size_t p = pos();
      ++cur_;
      const bool negate = is_ident("not");
      if (negate) ++cur_;
      auto name = primary();
      if (name->type != NodeType::Identifier) error("expected a test name after 'is'");
      auto n = std::make_unique<Node>(NodeType::Test, p);
      n->a = std::move(operand);
      n->str = name->str;
      n->flag = negate;
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr filter_expression() {
    auto operand = unary_sign();
    while (is(Tok::Pipe)) {
      const size_t p = pos();
      ++cur_;
      auto f = primary();
      if (f->type != NodeType::Identifier) error("expected a filter name after '|'");
      if (is(Tok::LParen)) f = call_expression(std::move(f));
      auto n = std::make_unique<Node>(NodeType::Filter, p);
      n->a = std::move(operand);
      n->b = std::move(f);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr unary_sign() {
    DepthGuard guard(*this);
    if ((is(Tok::Unary) || is(Tok::Additive)) && (t_[cur_].value == "-" || t_[cur_].value == "+")) {
      auto n = std::make_unique<Node>(NodeType::Unary, pos());
      n->str = t_[cur_++].value;
      n->a = unary_sign();
      return n;
    }
    auto m = member(primary());
    if (is(Tok::LParen)) return call_expression(std::move(m));
    return m;
  }
  NodePtr call_expression(NodePtr callee) {
    DepthGuard guard(*this);
    auto n = std::make_unique<Node>(NodeType::Call, pos());
    n->a = std::move(callee);
    n->args = arguments(false);
    auto e = member(std::move(n));
    if (is(Tok::LParen)) return call_expression(std::move(e));
    return e;
  }
  // `(a, b=1, *rest, **kw)`; parameters=true for macro/caller declarations.
  std::vector<NodePtr> arguments(bool parameters) {
    expect(Tok::LParen, "'('");
    std::vector<NodePtr> args;
    std::set<std::string> names;
    bool saw_keyword = false, saw_spread = false;
    while (!is(Tok::RParen)) {
      if (at_end()) error("unexpected end of template in an argument list");
      const size_t p = pos();
      const bool kw_spread = is(Tok::Power);
      const bool pos_spread = is(Tok::Multiplicative) && t_[cur_].value == "*";
      if (parameters && (kw_spread || pos_spread)) error("argument unpacking is not allowed in parameter declarations");
      if (kw_spread) {
        ++cur_;
        auto n = std::make_unique<Node>(NodeType::KwSpread, p);
        n->a = expression();
        args.push_back(std::move(n));
        if (is(Tok::Comma)) ++cur_;
        if (!is(Tok::RParen)) error("'**' must be applied to the final argument");
        break;
      }
      NodePtr arg;
      if (pos_spread) {
        if (saw_spread) error("only one '*' argument unpacking is allowed");
        saw_spread = true;
        ++cur_;
        arg = std::make_unique<Node>(NodeType::Spread, p);
        arg->a = expression();
      } else {
        arg = expression();
        if (is(Tok::Equals)) {
          ++cur_;
          if (arg->type != NodeType::Identifier) error("expected an identifier before '=' in an argument list");
          auto kw = std::make_unique<Node>(NodeType::KwArg, p);
          kw->str = arg->str;
          kw->a = expression();
          arg = std::move(kw);
        }
        if (parameters) {
          if (arg->type != NodeType::Identifier && arg->type != NodeType::KwArg)
            error("expected an identifier for a parameter declaration");
          if (!names.insert(arg->str).second) error("duplicate parameter name '" + arg->str + "'");
        }
        if (arg->type == NodeType::KwArg)
          saw_keyword = true;
        else if (saw_keyword)
          error(parameters ? "non-default parameter follows a default parameter"
                           : "positional argument follows a keyword argument");
        else if (saw_spread)
          error("positional arguments must not follow '*' unpacking");
      }
      args.push_back(std::move(arg));
      if (is(Tok::Comma)) ++cur_;
    }
    expect(Tok::RParen, "')'");
    return args;
  }
  NodePtr subscript() {
    const size_t p = pos();
    std::vector<NodePtr> parts;
    bool slice = false;
    while (!is(Tok::RBracket)) {
      if (at_end()) error("unexpected end of template, expected ']'");
      if (is(Tok::Colon)) {
        parts.push_back(nullptr);
        ++cur_;
        slice = true;
      } else {
        parts.push_back(expression());
        if (is(Tok::Colon)) {
          ++cur_;
          slice = true;
        }
      }
    }
    if (parts.empty()) error("expected an index or slice inside '[]'");
    if (!slice) return std::move(parts[0]);
    if (parts.size() > 3) error("a slice takes at most 3 parts");
    auto n = std::make_unique<Node>(NodeType::Slice, p);
    n->a = std::move(parts[0]);
    if (parts.size() > 1) n->b = std::move(parts[1]);
    if (parts.size() > 2) n->c = std::move(parts[2]);
    return n;
  }
  NodePtr member(NodePtr object) {
    while (is(Tok::Dot) || is(Tok::LBracket)) {
      const bool computed = is(Tok::LBracket);
      auto n = std::make_unique<Node>(NodeType::Member, pos());
      ++cur_;
      if (computed) {
        n->b = subscript();
        expect(Tok::RBracket, "']'");
      } else {
        n->b = primary();
        if (n->b->type != NodeType::Identifier && n->b->type != NodeType::IntLit)
          error("expected an attribute name or integer after '.'");
      }
      n->a = std::move(object);
      n->flag = computed;
      object = std::move(n);
    }
    return object;
  }
  NodePtr primary() {
    if (at_end()) error("unexpected end of template in an expression");
    const Token& tk = t_[cur_++];
    switch (tk.type) {
      case Tok::Number: {
        const bool is_float = tk.value.find('.') != std::string::npos;
        auto n = std::make_unique<Node>(is_float ? NodeType::FloatLit : NodeType::IntLit, tk.pos);
        n->num = std::strtod(tk.value.c_str(), nullptr);
        return n;
      }
      case Tok::String: {
        auto n = std::make_unique<Node>(NodeType::StringLit, tk.pos);
        n->str = tk.value;
        while (is(Tok::String)) n->str += t_[cur_++].value;  // adjacent literals concatenate
        return n;
      }
      case Tok::Ident: {
        auto n = std::make_unique<Node>(NodeType::Identifier, tk.pos);
        n->str = tk.value;
        return n;
      }
      case Tok::LParen: {
        auto e = expression_sequence(false);
        expect(Tok::RParen, "')'");
        return e;
      }
      case Tok::LBracket: {
        auto n = std::make_unique<Node>(NodeType::ArrayLit, tk.pos);
        while (!is(Tok::RBracket)) {
          if (at_end()) error("unexpected end of template, expected ']'");
          n->args.push_back(expression());
          if (is(Tok::Comma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      case Tok::LBrace: {
        auto n = std::make_unique<Node>(NodeType::ObjectLit, tk.pos);
        while (!is(Tok::RBrace)) {
          if (at_end()) error("unexpected end of template, expected '}'");
          auto k = expression();
          expect(Tok::Colon, "':' between key and value");
          auto v = expression();
          n->pairs.emplace_back(std::move(k), std::move(v));
          if (is(Tok::Comma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      default:
        --cur_;
        error("unexpected " + describe_current() + " in an expression");
    }
  }
};

}  // namespace

NodePtr parse(const Lexed& lexed, std::string_view source) { return Parser(lexed, source).program(); }

}  // namespace perry::tokenizer::jinja
