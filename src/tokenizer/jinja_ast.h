// Tokens and syntax tree of the Jinja-subset interpreter (lexer → parser → AST → evaluator).
// The grammar, precedence and whitespace handling follow @huggingface/jinja, the reference renderer
// chat templates are checked against.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace perry::tokenizer::jinja {

enum class Tok {
  Text, Number, String, Ident, Equals, LParen, RParen, OpenStmt, CloseStmt, OpenExpr, CloseExpr,
  LBracket, RBracket, LBrace, RBrace, Comma, Dot, Colon, Pipe, Additive, Multiplicative, Power,
  Comparison, Unary, Comment
};

struct Token {
  Tok type;
  std::string value;
  size_t pos;  // byte offset in the original template source
};

struct Lexed {
  std::vector<Token> tokens;
  size_t end_pos = 0;  // offset reported for "unexpected end of template"
};

// Tokenizes with HF's settings (trim_blocks, lstrip_blocks, one trailing newline dropped).
// Throws perry::Error "chat template syntax error at line L, column C: ...".
Lexed tokenize(std::string_view source);

// Formats a positioned error for `source` (line and column are 1-based, columns in code points).
[[noreturn]] void syntax_error(std::string_view source, size_t pos, const std::string& msg);

enum class NodeType {
  Program, If, For, Break, Continue, Set, Macro, Comment, CallStatement, FilterStatement,
  Member, Call, Identifier, IntLit, FloatLit, StringLit, ArrayLit, TupleLit, ObjectLit, Binary,
  Filter, Select, Test, Unary, Slice, KwArg, Spread, KwSpread, Ternary
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

// One node struct for every kind keeps the tree simple; the fields each kind uses:
//   If: a=test body alt | For: a=loop target b=iterable body alt=else-block
//   Set: a=target b=value (null: block set) body | Macro: str=name args body
//   CallStatement: a=Call args=caller parameters body | FilterStatement: a=filter body
//   Member: a=object b=property flag=computed ([]) | Call: a=callee args
//   Identifier/StringLit: str | IntLit/FloatLit: num | ArrayLit/TupleLit: args | ObjectLit: pairs
//   Binary: str=op a b | Filter: a=operand b=filter (Identifier or Call) | Select: a=value b=test
//   Test: a=operand str=test name flag=negated | Unary: str=op a | Slice: a b c (each may be null)
//   KwArg: str=key a=value | Spread/KwSpread: a | Ternary: a=condition b=true c=false
struct Node {
  NodeType type;
  size_t pos = 0;
  std::string str;
  double num = 0;
  bool flag = false;
  NodePtr a, b, c;
  std::vector<NodePtr> body, alt, args;
  std::vector<std::pair<NodePtr, NodePtr>> pairs;
  Node(NodeType t, size_t p) : type(t), pos(p) {}
};

NodePtr parse(const Lexed& lexed, std::string_view source);

}  // namespace perry::tokenizer::jinja
