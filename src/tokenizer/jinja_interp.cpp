// Statements, scopes and operators of the Jinja-subset evaluator.
#include "tokenizer/jinja_interp.h"

#include <cmath>

#include "core/error.h"

namespace perry::tokenizer::jinja {

namespace {

struct BreakSignal {};
struct ContinueSignal {};

// Guards against templates (or fuzz inputs) that recurse without end or build gigantic strings.
constexpr int kMaxDepth = 256;
constexpr size_t kMaxString = size_t(64) << 20;

bool is_list_like(const Value& v) { return v.is_list(); }

}  // namespace

Value Env::lookup(const std::string& name) const {
  for (const Env* e = this; e; e = e->parent_.get()) {
    auto it = e->vars_.find(name);
    if (it != e->vars_.end()) return it->second;
  }
  return Value::undefined();
}

void Interpreter::error_at(const Node& n, const std::string& msg) const {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < n.pos && i < source_.size();) {
    if (source_[i] == '\n') {
      ++line;
      col = 1;
      ++i;
    } else {
      next_code_point(source_, i);
      ++col;
    }
  }
  fail("chat template error at line {}, column {}: {}", line, col, msg);
}

std::string Interpreter::exec_block(const std::vector<NodePtr>& body, const EnvPtr& env) {
  std::string out;
  for (const auto& s : body) exec(*s, env, out);
  return out;
}

void Interpreter::exec(const Node& n, const EnvPtr& env, std::string& out) {
  switch (n.type) {
    case NodeType::Program: out += exec_block(n.body, env); return;
    case NodeType::Comment: return;
    case NodeType::If: {
      const bool t = eval(*n.a, env).truthy();
      out += exec_block(t ? n.body : n.alt, env);
      return;
    }
    case NodeType::For: exec_for(n, env, out); return;
    case NodeType::Set: exec_set(n, env); return;
    case NodeType::Macro: env->set(n.str, make_macro(n)); return;
    case NodeType::Break: throw BreakSignal{};
    case NodeType::Continue: throw ContinueSignal{};
    case NodeType::CallStatement: {
      const Value v = call_statement(n, env);
      if (!v.is_null() && !v.is_undefined()) out += v.to_output();
      return;
    }
    case NodeType::FilterStatement: {
      const Value body = Value::string(exec_block(n.body, env));
      const Value v = apply_filter(body, *n.a, env);
      if (!v.is_null() && !v.is_undefined()) out += v.to_output();
      return;
    }
    default: {
      const Value v = eval(n, env);
      if (!v.is_null() && !v.is_undefined()) {
        try {
          out += v.to_output();
        } catch (const Error& e) {
          error_at(n, e.what());
        }
      }
      if (out.size() > kMaxString) error_at(n, "rendered text exceeds 64 MiB");
    }
  }
}

void Interpreter::exec_for(const Node& n, const EnvPtr& env, std::string& out) {
  auto scope = std::make_shared<Env>(env);
  const Node* test = nullptr;
  Value iterable;
  if (n.b->type == NodeType::Select) {  // `for x in xs if cond`: cond filters before loop.* is set
    iterable = eval(*n.b->a, scope);
    test = n.b->b.get();
  } else {
    iterable = eval(*n.b, scope);
  }
  if (iterable.is_dict()) {
    List keys;
    for (const auto& kv : iterable.map().items) keys.push_back(Value::string(kv.first));
    iterable = Value::list(std::move(keys));
  }
  if (!is_list_like(iterable)) error_at(*n.b, "cannot iterate over a " + iterable.type_name());
  const Node& target = *n.a;
  auto bind = [&](const EnvPtr& s, const Value& item) {
    if (target.type == NodeType::Identifier) {
      s->set(target.str, item);
      return;
    }
    if (item.kind() != Kind::List) error_at(target, "cannot unpack a " + item.type_name() + " in a for loop");
    const auto& parts = item.items();
    if (parts.size() != target.args.size())
      error_at(target, fmt::format("too {} items to unpack", target.args.size() > parts.size() ? "few" : "many"));
    for (size_t j = 0; j < parts.size(); ++j) {
      if (target.args[j]->type != NodeType::Identifier) error_at(target, "can only unpack into names");
      s->set(target.args[j]->str, parts[j]);
    }
  };
  std::vector<Value> items;
  const List source = iterable.items();  // copy: the body may mutate the list
  for (const auto& item : source) {
    if (test) {
      auto loop_scope = std::make_shared<Env>(scope);
      bind(loop_scope, item);
      if (!eval(*test, loop_scope).truthy()) continue;
    }
    items.push_back(item);
  }
  bool no_iteration = true;
  const size_t count = items.size();
  for (size_t i = 0; i < count; ++i) {
    Dict loop;
    loop.items.reserve(9);
    loop.items.emplace_back("index", Value::integer(double(i + 1)));
    loop.items.emplace_back("index0", Value::integer(double(i)));
    loop.items.emplace_back("revindex", Value::integer(double(count - i)));
    loop.items.emplace_back("revindex0", Value::integer(double(count - i - 1)));
    loop.items.emplace_back("first", Value::boolean(i == 0));
    loop.items.emplace_back("last", Value::boolean(i + 1 == count));
    loop.items.emplace_back("length", Value::integer(double(count)));
    loop.items.emplace_back("previtem", i > 0 ? items[i - 1] : Value::undefined());
    loop.items.emplace_back("nextitem", i + 1 < count ? items[i + 1] : Value::undefined());
    scope->set("loop", Value::dict(std::move(loop)));
    bind(scope, items[i]);
    // Output of an iteration cut short by break/continue is dropped, as in the reference.
    try {
      out += exec_block(n.body, scope);
    } catch (const ContinueSignal&) {
      continue;
    } catch (const BreakSignal&) {
      break;
    }
    if (out.size() > kMaxString) error_at(n, "rendered text exceeds 64 MiB");
    no_iteration = false;
  }
  if (no_iteration) out += exec_block(n.alt, scope);
}

namespace {
// Whether `v` holds (directly or nested) the dict `target`. Values share their containers by
// shared_ptr, so storing a namespace inside itself would make a reference cycle that is never
// freed (and cannot be printed): refuse it at the assignment.
bool contains_dict(const Value& v, const Dict* target, int depth = 0) {
  if (depth > 64) return false;
  switch (v.kind()) {
    case Kind::Dict: case Kind::Namespace: case Kind::KwArgs:
      if (&v.map() == target) return true;
      for (const auto& [k, x] : v.map().items)
        if (contains_dict(x, target, depth + 1)) return true;
      return false;
    case Kind::List: case Kind::Tuple:
      for (const auto& x : v.items())
        if (contains_dict(x, target, depth + 1)) return true;
      return false;
    default: return false;
  }
}
}  // namespace

void Interpreter::exec_set(const Node& n, const EnvPtr& env) {
  Value rhs = n.b ? eval(*n.b, env) : Value::string(exec_block(n.body, env));
  const Node& target = *n.a;
  if (target.type == NodeType::Identifier) {
    env->set(target.str, std::move(rhs));
  } else if (target.type == NodeType::TupleLit) {
    if (!rhs.is_list()) error_at(target, "cannot unpack a " + rhs.type_name() + " in set");
    const auto& parts = rhs.items();
    if (parts.size() != target.args.size())
      error_at(target, fmt::format("too {} items to unpack in set", target.args.size() > parts.size() ? "few" : "many"));
    for (size_t j = 0; j < parts.size(); ++j) {
      if (target.args[j]->type != NodeType::Identifier) error_at(target, "can only unpack into names");
      env->set(target.args[j]->str, parts[j]);
    }
  } else if (target.type == NodeType::Member) {
    const Value obj = eval(*target.a, env);
    if (obj.kind() != Kind::Namespace) error_at(target, "can only assign attributes of a namespace()");
    if (target.flag || target.b->type != NodeType::Identifier) error_at(target, "namespace attribute must be a name");
    if (contains_dict(rhs, &obj.map())) error_at(target, "cyclic value: a namespace cannot contain itself");
    obj.map().set(target.b->str, std::move(rhs));
  } else {
    error_at(target, "invalid assignment target in set");
  }
}

namespace {

// Whether a macro body mentions `kwargs` / `varargs` (then extra arguments are collected, not errors).
void find_special(const Node& n, bool& kwargs, bool& varargs) {
  if (n.type == NodeType::Identifier) {
    kwargs = kwargs || n.str == "kwargs";
    varargs = varargs || n.str == "varargs";
  }
  for (const Node* c : {n.a.get(), n.b.get(), n.c.get()})
    if (c) find_special(*c, kwargs, varargs);
  for (const auto* v : {&n.body, &n.alt, &n.args})
    for (const auto& c : *v)
      if (c) find_special(*c, kwargs, varargs);
  for (const auto& [k, v] : n.pairs) {
    find_special(*k, kwargs, varargs);
    find_special(*v, kwargs, varargs);
  }
}

}  // namespace

void Interpreter::bind_arguments(const std::string& display, const std::vector<NodePtr>& params,
                                 const Node& body_owner, std::vector<Value> args, const EnvPtr& scope) {
  Dict kw;
  if (!args.empty() && args.back().kind() == Kind::KwArgs) {
    kw = args.back().map();
    args.pop_back();
  }
  bool want_kwargs = false, want_varargs = false;
  for (const auto& s : body_owner.body) find_special(*s, want_kwargs, want_varargs);
  std::vector<std::pair<std::string, const Node*>> pending;
  for (size_t i = 0; i < params.size(); ++i) {
    const Node& p = *params[i];
    const std::string& name = p.str;
    Value v;
    bool given = i < args.size();
    if (given) v = args[i];
    if (!given) {
      if (const Value* k = kw.find(name)) {
        v = *k;
        kw.erase(name);
        given = true;
      }
    }
    if (!given && p.type == NodeType::KwArg) pending.emplace_back(name, p.a.get());
    scope->set(name, given ? v : Value::undefined());
  }
  if (want_kwargs)
    scope->set("kwargs", Value::dict(kw));
  else if (!kw.items.empty())
    fail("macro {} takes no keyword argument '{}'", display, kw.items.front().first);
  if (want_varargs)
    scope->set("varargs", Value::list(args.size() > params.size() ? List(args.begin() + params.size(), args.end()) : List{}));
  else if (args.size() > params.size())
    fail("macro {} takes not more than {} argument(s)", display, params.size());
  for (const auto& [name, def] : pending) scope->set(name, eval(*def, scope));
}

Value Interpreter::make_macro(const Node& n) {
  const Node* node = &n;  // the tree outlives every render
  return Value::function([this, node](std::vector<Value>& args, Env& caller) -> Value {
    if (++depth_ > kMaxDepth) {
      depth_ = 0;
      error_at(*node, "macro recursion too deep");
    }
    auto scope = std::make_shared<Env>(caller.shared_from_this());
    bind_arguments("'" + node->str + "'", node->args, *node, args, scope);
    Value r = Value::string(exec_block(node->body, scope));
    --depth_;
    return r;
  });
}

Value Interpreter::call_statement(const Node& n, const EnvPtr& env) {
  const Node* node = &n;
  EnvPtr captured = env;
  Value caller = Value::function([this, node, captured](std::vector<Value>& args, Env&) -> Value {
    auto scope = std::make_shared<Env>(captured);
    bind_arguments("caller", node->args, *node, args, scope);
    return Value::string(exec_block(node->body, scope));
  });
  Dict kw;
  std::vector<Value> args = eval_args(n.a->args, env, kw);
  args.push_back(Value::dict(std::move(kw), Kind::KwArgs));
  const Value fn = eval(*n.a->a, env);
  if (fn.kind() != Kind::Function) error_at(n, "cannot call a " + fn.type_name());
  auto call_env = std::make_shared<Env>(env);
  call_env->set("caller", caller);
  return fn.fn()(args, *call_env);
}

std::vector<Value> Interpreter::eval_args(const std::vector<NodePtr>& args, const EnvPtr& env, Dict& kwargs) {
  std::vector<Value> pos;
  for (const auto& a : args) {
    if (a->type == NodeType::Spread) {
      const Value v = eval(*a->a, env);
      if (!v.is_list()) error_at(*a, "cannot unpack a " + v.type_name() + " with '*'");
      for (const auto& e : v.items()) pos.push_back(e);
    } else if (a->type != NodeType::KwArg && a->type != NodeType::KwSpread) {
      pos.push_back(eval(*a, env));
    }
  }
  auto add = [&](const Node& at, const std::string& k, Value v) {
    if (kwargs.find(k)) error_at(at, "got multiple values for keyword argument '" + k + "'");
    kwargs.items.emplace_back(k, std::move(v));
  };
  for (const auto& a : args) {
    if (a->type == NodeType::KwArg) {
      add(*a, a->str, eval(*a->a, env));
    } else if (a->type == NodeType::KwSpread) {
      const Value v = eval(*a->a, env);
      if (!v.is_dict()) error_at(*a, "argument after ** must be a mapping, not " + v.type_name());
      for (const auto& [k, e] : v.map().items) add(*a, k, e);
    }
  }
  return pos;
}

Value Interpreter::eval_call(const Node& n, const EnvPtr& env) {
  Dict kw;
  std::vector<Value> args = eval_args(n.args, env, kw);
  if (!kw.items.empty()) args.push_back(Value::dict(std::move(kw), Kind::KwArgs));
  const Value fn = eval(*n.a, env);
  if (fn.kind() != Kind::Function) error_at(n, "cannot call a " + fn.type_name() + " (not a function)");
  try {
    return fn.fn()(args, *env);
  } catch (const Error& e) {
    if (std::string_view(e.what()).substr(0, 13) == "chat template") throw;
    error_at(n, e.what());
  }
}

Value Interpreter::eval_slice(const Value& obj, const Node& n, const EnvPtr& env) {
  if (!obj.is_list() && !obj.is_string()) error_at(n, "can only slice a list or string, not a " + obj.type_name());
  double bound[3];
  bool given[3];
  const Node* parts[3] = {n.a.get(), n.b.get(), n.c.get()};
  for (int k = 0; k < 3; ++k) {
    const Value v = parts[k] ? eval(*parts[k], env) : Value::undefined();
    if (v.kind() != Kind::Int && !v.is_undefined()) error_at(n, "slice bounds must be integers");
    given[k] = !v.is_undefined();
    bound[k] = v.num();
  }
  std::vector<std::string> chars;
  if (obj.is_string()) chars = utf8_chars(obj.str());
  const double len = obj.is_string() ? double(chars.size()) : double(obj.items().size());
  const double step = given[2] ? bound[2] : 1;
  const double dir = step > 0 ? 1 : step < 0 ? -1 : 0;
  double start, stop;
  if (dir >= 0) {
    start = given[0] ? bound[0] : 0;
    start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
    stop = given[1] ? bound[1] : len;
    stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
  } else {
    start = given[0] ? bound[0] : len - 1;
    start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
    stop = given[1] ? bound[1] : -1;
    stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
  }
  List out_list;
  std::string out_str;
  for (double i = start; dir * i < dir * stop; i += step) {
    if (obj.is_string())
      out_str += chars[size_t(i)];
    else
      out_list.push_back(obj.items()[size_t(i)]);
  }
  return obj.is_string() ? Value::string(std::move(out_str)) : Value::list(std::move(out_list));
}

Value Interpreter::eval_member(const Node& n, const EnvPtr& env) {
  const Value obj = eval(*n.a, env);
  Value prop;
  if (n.flag) {
    if (n.b->type == NodeType::Slice) return eval_slice(obj, *n.b, env);
    prop = eval(*n.b, env);
  } else if (n.b->type == NodeType::IntLit) {
    prop = Value::integer(n.b->num);
  } else {
    prop = Value::string(n.b->str);
  }
  if (obj.is_attr_container()) {
    if (!prop.is_string()) error_at(n, "cannot look up a " + prop.type_name() + " key in a " + obj.type_name());
    if (const Value* v = obj.map().find(prop.str())) return *v;
    return obj.is_dict() ? builtin_member(obj, prop.str()) : Value::undefined();
  }
  if (obj.is_list() || obj.is_string()) {
    if (prop.kind() == Kind::Int) {
      if (obj.is_string()) {  // indexes count code points (the reference counts UTF-16 units)
        const auto chars = utf8_chars(obj.str());
        const double i = prop.num() < 0 ? prop.num() + double(chars.size()) : prop.num();
        if (i < 0 || i >= double(chars.size())) return Value::undefined();
        return Value::string(chars[size_t(i)]);
      }
      const auto& l = obj.items();
      const double i = prop.num() < 0 ? prop.num() + double(l.size()) : prop.num();
      if (i < 0 || i >= double(l.size())) return Value::undefined();
      return l[size_t(i)];
    }
    if (prop.is_string()) return builtin_member(obj, prop.str());
    error_at(n, "cannot index a " + obj.type_name() + " with a " + prop.type_name());
  }
  if (!prop.is_string()) error_at(n, "cannot index a " + obj.type_name() + " with a " + prop.type_name());
  return builtin_member(obj, prop.str());
}

Value Interpreter::eval_binary(const Node& n, const EnvPtr& env) {
  const std::string& op = n.str;
  const Value l = eval(*n.a, env);
  if (op == "and") return l.truthy() ? eval(*n.b, env) : l;
  if (op == "or") return l.truthy() ? l : eval(*n.b, env);
  const Value r = eval(*n.b, env);
  if (op == "==") return Value::boolean(loose_equal(l, r));
  if (op == "!=") return Value::boolean(!loose_equal(l, r));
  if (l.is_undefined() || r.is_undefined()) {
    if (r.is_undefined() && (op == "in" || op == "not in")) return Value::boolean(op == "not in");
    error_at(n, "cannot apply '" + op + "' to an undefined value");
  }
  if (l.is_null() || r.is_null()) error_at(n, "cannot apply '" + op + "' to none");
  auto check_size = [&](Value v) {
    if (v.is_string() && v.str().size() > kMaxString) error_at(n, "string exceeds 64 MiB");
    return v;
  };
  if (op == "~") return check_size(Value::string(l.raw_string() + r.raw_string()));
  const auto numeric_like = [](const Value& v) { return v.is_number() || v.kind() == Kind::Bool; };
  if (op == "**" && numeric_like(l) && numeric_like(r)) {
    const double a = l.num(), b = r.num();
    if (a == 0 && b < 0) error_at(n, "0.0 cannot be raised to a negative power");
    const double res = std::pow(a, b);
    if (!std::isfinite(res)) error_at(n, "exponentiation result is not a finite number");
    const bool is_float = l.kind() == Kind::Float || r.kind() == Kind::Float || b < 0;
    return is_float ? Value::floating(res) : Value::integer(res);
  }
  if (l.is_number() && r.is_number()) {
    const double a = l.num(), b = r.num();
    const bool is_float = l.kind() == Kind::Float || r.kind() == Kind::Float;
    auto num = [&](double v) { return is_float ? Value::floating(v) : Value::integer(v); };
    if (op == "+") return num(a + b);
    if (op == "-") return num(a - b);
    if (op == "*") return num(a * b);
    if (op == "/") return Value::floating(a / b);
    if (op == "//") return num(std::floor(a / b));
    if (op == "%") return num(std::fmod(a, b));
    if (op == "<") return Value::boolean(a < b);
    if (op == ">") return Value::boolean(a > b);
    if (op == ">=") return Value::boolean(a >= b);
    if (op == "<=") return Value::boolean(a <= b);
  } else if (l.is_list() && r.is_list()) {
    if (op == "+") {
      List out = l.items();
      out.insert(out.end(), r.items().begin(), r.items().end());
      return Value::list(std::move(out));
    }
  } else if (r.is_list()) {
    if (op == "in" || op == "not in") {
      bool member = false;
      for (const auto& e : r.items())
        if (strict_equal(e, l)) {
          member = true;
          break;
        }
      return Value::boolean(member == (op == "in"));
    }
  }
  if ((l.is_string() || r.is_string()) && op == "+") return check_size(Value::string(l.raw_string() + r.raw_string()));
  if (l.is_string() && r.is_string() && (op == "in" || op == "not in"))
    return Value::boolean((r.str().find(l.str()) != std::string::npos) == (op == "in"));
  if (l.is_string() && r.is_dict() && (op == "in" || op == "not in"))
    return Value::boolean((r.map().find(l.str()) != nullptr) == (op == "in"));
  error_at(n, "unsupported operator '" + op + "' between " + l.type_name() + " and " + r.type_name());
}

Value Interpreter::eval(const Node& n, const EnvPtr& env) {
  switch (n.type) {
    case NodeType::IntLit: return Value::integer(n.num);
    case NodeType::FloatLit: return Value::floating(n.num);
    case NodeType::StringLit: return Value::string(n.str);
    case NodeType::Identifier: return env->lookup(n.str);
    case NodeType::ArrayLit:
    case NodeType::TupleLit: {
      List l;
      for (const auto& e : n.args) l.push_back(eval(*e, env));
      return Value::list(std::move(l), n.type == NodeType::ArrayLit ? Kind::List : Kind::Tuple);
    }
    case NodeType::ObjectLit: {
      Dict d;
      for (const auto& [k, v] : n.pairs) {
        const Value key = eval(*k, env);
        if (!key.is_string()) error_at(*k, "dict keys must be strings, got a " + key.type_name());
        d.set(key.str(), eval(*v, env));
      }
      return Value::dict(std::move(d));
    }
    case NodeType::Binary: return eval_binary(n, env);
    case NodeType::Member: return eval_member(n, env);
    case NodeType::Call: return eval_call(n, env);
    case NodeType::Filter: {
      const Value operand = eval(*n.a, env);
      try {
        return apply_filter(operand, *n.b, env);
      } catch (const Error& e) {
        if (std::string_view(e.what()).substr(0, 13) == "chat template") throw;
        error_at(n, e.what());
      }
    }
    case NodeType::Test: {
      const Value operand = eval(*n.a, env);
      try {
        const bool r = apply_test(n.str, operand, nullptr).truthy();
        return Value::boolean(n.flag ? !r : r);
      } catch (const Error& e) {
        if (std::string_view(e.what()).substr(0, 13) == "chat template") throw;
        error_at(n, e.what());
      }
    }
    case NodeType::Select: return eval(*n.b, env).truthy() ? eval(*n.a, env) : Value::undefined();
    case NodeType::Ternary: return eval(*n.a, env).truthy() ? eval(*n.b, env) : eval(*n.c, env);
    case NodeType::Unary: {
      const Value v = eval(*n.a, env);
      if (n.str == "not") return Value::boolean(!v.truthy());
      if (!(v.is_number() || v.kind() == Kind::Bool)) error_at(n, "bad operand for unary " + n.str + ": " + v.type_name());
      const double r = (n.str == "-" ? -1.0 : 1.0) * v.num();
      return v.kind() == Kind::Float ? Value::floating(r) : Value::integer(r);
    }
    default: error_at(n, "this construct is not valid in an expression");
  }
}

std::string Interpreter::render(const Value& context) {
  auto global = std::make_shared<Env>();
  global->set("true", Value::boolean(true));
  global->set("false", Value::boolean(false));
  global->set("none", Value::null());
  global->set("True", Value::boolean(true));
  global->set("False", Value::boolean(false));
  global->set("None", Value::null());
  global->set("raise_exception", Value::function([](std::vector<Value>& args, Env&) -> Value {
    fail("chat template raise_exception: {}", args.empty() ? std::string("undefined") : args[0].raw_string());
  }));
  global->set("range", Value::function([](std::vector<Value>& args, Env&) -> Value {
    for (const auto& a : args)
      if (!a.is_number()) fail("range() arguments must be numbers, got a {}", a.type_name());
    double start = 0, stop = 0, step = 1;
    if (args.size() == 1) {
      stop = args[0].num();
    } else if (args.size() >= 2) {
      start = args[0].num();
      stop = args[1].num();
      if (args.size() >= 3) step = args[2].num();
    }
    if (step == 0) fail("range() step must not be zero");
    List out;
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= (size_t(1) << 24)) fail("range() is too long");
      out.push_back(Value::integer(i));
    }
    return Value::list(std::move(out));
  }));
  const std::tm now = now_;
  global->set("strftime_now", Value::function([now](std::vector<Value>& args, Env&) -> Value {
    if (args.empty() || !args[0].is_string()) fail("strftime_now() expects a format string");
    return Value::string(strftime_js(now, args[0].str()));
  }));
  global->set("namespace", Value::function([](std::vector<Value>& args, Env&) -> Value {
    Dict kw;
    std::vector<Value> pos = args;
    if (!pos.empty() && pos.back().kind() == Kind::KwArgs) {
      kw = pos.back().map();
      pos.pop_back();
    }
    if (pos.size() > 1) fail("namespace() expected at most 1 positional argument, got {}", pos.size());
    Dict entries;
    if (pos.size() == 1) {
      const Value& src = pos[0];
      if (src.is_dict()) {
        for (const auto& [k, v] : src.map().items) entries.set(k, v);
      } else if (src.is_list()) {
        for (const auto& pair : src.items()) {
          if (!pair.is_list() || pair.items().size() != 2 || !pair.items()[0].is_string())
            fail("namespace() expected a mapping or a list of [key, value] pairs");
          entries.set(pair.items()[0].str(), pair.items()[1]);
        }
      } else {
        fail("namespace() cannot be built from a {}", src.type_name());
      }
    }
    for (const auto& [k, v] : kw.items) entries.set(k, v);
    return Value::dict(std::move(entries), Kind::Namespace);
  }));
  if (!context.is_dict()) fail("chat template context must be a JSON object, got a {}", context.type_name());
  for (const auto& [k, v] : context.map().items) {
    // The reference declares context variables next to the built-ins and rejects collisions.
    if (global->has_own(k)) fail("chat template context variable '{}' collides with a built-in name", k);
    global->set(k, v);
  }
  depth_ = 0;
  try {
    return exec_block(program_.body, global);
  } catch (const BreakSignal&) {
    fail("chat template error: 'break' outside a for loop");
  } catch (const ContinueSignal&) {
    fail("chat template error: 'continue' outside a for loop");
  }
}

}  // namespace perry::tokenizer::jinja
