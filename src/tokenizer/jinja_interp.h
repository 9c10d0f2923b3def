// Tree-walking evaluator for the Jinja subset (scopes, statements, operators) and its built-ins
// (filters, tests, string/dict methods, globals), matching @huggingface/jinja's semantics.
#pragma once
#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace perry::tokenizer::jinja {

// A variable scope. `for` bodies and macro calls get a child scope (so a plain `set` inside a loop
// does not leak out, which is why templates use namespace()); `if` blocks do not.
class Env : public std::enable_shared_from_this<Env> {
 public:
  explicit Env(std::shared_ptr<Env> parent = nullptr) : parent_(std::move(parent)) {}
  Value lookup(const std::string& name) const;
  void set(const std::string& name, Value v) { vars_[name] = std::move(v); }
  bool has_own(const std::string& name) const { return vars_.count(name) != 0; }

 private:
  std::shared_ptr<Env> parent_;
  std::unordered_map<std::string, Value> vars_;
};
using EnvPtr = std::shared_ptr<Env>;

class Interpreter {
 public:
  Interpreter(const Node& program, std::string_view source, const std::tm& now)
      : program_(program), source_(source), now_(now) {}
  // Renders with `context` (a dict); keys become global variables.
  std::string render(const Value& context);

 private:
  const Node& program_;
  std::string_view source_;
  std::tm now_;
  int depth_ = 0;  // recursion guard: macros can call themselves

  void exec(const Node& n, const EnvPtr& env, std::string& out);
  std::string exec_block(const std::vector<NodePtr>& body, const EnvPtr& env);
  void exec_for(const Node& n, const EnvPtr& env, std::string& out);
  void exec_set(const Node& n, const EnvPtr& env);
  Value make_macro(const Node& n);
  Value call_statement(const Node& n, const EnvPtr& env);
  void bind_arguments(const std::string& display, const std::vector<NodePtr>& params, const Node& body_owner,
                      std::vector<Value> args, const EnvPtr& scope);

  Value eval(const Node& n, const EnvPtr& env);
  Value eval_binary(const Node& n, const EnvPtr& env);
  Value eval_member(const Node& n, const EnvPtr& env);
  Value eval_slice(const Value& obj, const Node& n, const EnvPtr& env);
  Value eval_call(const Node& n, const EnvPtr& env);
  std::vector<Value> eval_args(const std::vector<NodePtr>& args, const EnvPtr& env, Dict& kwargs);
  Value apply_filter(const Value& operand, const Node& filter, const EnvPtr& env);
  Value apply_test(const std::string& name, const Value& operand, const Value* arg) const;

  [[noreturn]] void error_at(const Node& n, const std::string& msg) const;
  friend struct Builtins;
};

// Attribute/method lookup on a value (`s.upper`, `d.items`, `l.length`); undefined when absent.
Value builtin_member(const Value& obj, const std::string& name);
// strftime subset of the reference (%Y %m %d %b %B %H %M %%), English month names.
std::string strftime_js(const std::tm& t, const std::string& format);

}  // namespace perry::tokenizer::jinja
