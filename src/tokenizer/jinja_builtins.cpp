// Built-ins of the Jinja-subset evaluator: filters, tests, string and dict methods, strftime.
// Semantics follow @huggingface/jinja (the reference renderer), including where it differs from
// Python's Jinja2: strip()/lstrip()/rstrip() ignore their argument and trim all whitespace, `length`
// counts UTF-16 units, booleans print as true/false.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "tokenizer/jinja_interp.h"

namespace perry::tokenizer::jinja {

namespace {

std::string map_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next_code_point(s, i);
    append_utf8(out, static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                                 : utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string title_case(std::string s) {  // /\b\w/g → upper case; the rest is left alone
  for (size_t i = 0; i < s.size(); ++i)
    if (is_word(s[i]) && (i == 0 || !is_word(s[i - 1]))) s[i] = static_cast<char>(std::toupper(s[i]));
  return s;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  next_code_point(s, i);
  return map_case(s.substr(0, i), true) + s.substr(i);
}

// JS parseInt(s, 10) / parseFloat(s); NaN when no number prefix.
double js_parse_int(const std::string& s) {
  const std::string t = js_trim(s, true, false);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  const size_t b = i;
  double v = 0;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') v = v * 10 + (t[i++] - '0');
  if (i == b) return NAN;
  return neg ? -v : v;
}

double js_parse_float(const std::string& s) {
  const std::string t = js_trim(s, true, false);
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
  if (t.compare(i, 8, "Infinity") == 0) return t[0] == '-' ? -INFINITY : INFINITY;
  size_t j = i;
  while (j < t.size() && std::isdigit(static_cast<unsigned char>(t[j]))) ++j;
  if (j < t.size() && t[j] == '.') {
    ++j;
    while (j < t.size() && std::isdigit(static_cast<unsigned char>(t[j]))) ++j;
  }
  if (j == i || (j == i + 1 && t[i] == '.')) return NAN;
  if (j < t.size() && (t[j] == 'e' || t[j] == 'E')) {
    size_t k = j + 1;
    if (k < t.size() && (t[k] == '+' || t[k] == '-')) ++k;
    const size_t d = k;
    while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) ++k;
    if (k > d) j = k;
  }
  return std::strtod(t.substr(0, j).c_str(), nullptr);
}

// Python-style str.replace with the reference's count semantics; an empty `old` inserts between
// code points.
std::string replace_str(const std::string& s, const std::string& old, const std::string& rep, double count) {
  if (count == 0) return s;
  double remaining = (std::isnan(count) || count < 0) ? INFINITY : count;
  std::string out;
  if (old.empty()) {
    const auto chars = utf8_chars(s);
    for (size_t i = 0; i <= chars.size(); ++i) {
      if (remaining > 0) {
        out += rep;
        --remaining;
      }
      if (i < chars.size()) out += chars[i];
    }
    return out;
  }
  size_t i = 0;
  while (true) {
    const size_t f = remaining > 0 ? s.find(old, i) : std::string::npos;
    if (f == std::string::npos) break;
    out.append(s, i, f - i);
    out += rep;
    --remaining;
    i = f + old.size();
  }
  out.append(s, i, std::string::npos);
  return out;
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null()) fail("cannot compare {} with {}", a.type_name(), b.type_name());
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined()) fail("cannot compare {} with {}", a.type_name(), b.type_name());
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Kind::Bool; };
  if (numeric(a) && numeric(b)) return a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
  if (a.kind() != b.kind()) fail("cannot compare different types: {} and {}", a.type_name(), b.type_name());
  if (a.is_string()) {
    const std::string x = case_sensitive ? a.str() : map_case(a.str(), false);
    const std::string y = case_sensitive ? b.str() : map_case(b.str(), false);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  fail("cannot compare values of type {}", a.type_name());
}

Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t b = 0;
  while (true) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (v.is_attr_container()) {
      const Value* f = v.map().find(part);
      v = f ? *f : Value::undefined();
    } else if (v.is_list()) {
      const double idx = js_parse_int(part);
      if (std::isnan(idx) || idx < 0 || idx >= double(v.items().size())) return Value::undefined();
      v = v.items()[size_t(idx)];
    } else {
      return Value::undefined();
    }
    if (e == std::string::npos) return v;
    b = e + 1;
  }
}

// Positional argument `i`, else keyword `name`, else null (nullptr).
const Value* arg_or_kw(const std::vector<Value>& args, const Dict& kw, size_t i, const char* name) {
  if (i < args.size()) return &args[i];
  return kw.find(name);
}

std::string indent_text(const std::string& s, int width, bool first, bool blank) {
  const std::string pad(std::max(width, 0), ' ');
  std::string out;
  size_t b = 0, line = 0;
  while (true) {
    const size_t e = s.find('\n', b);
    const std::string x = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (line) out += '\n';
    out += ((!first && line == 0) || (!blank && x.empty())) ? x : pad + x;
    if (e == std::string::npos) break;
    b = e + 1;
    ++line;
  }
  return out;
}

Value dict_items(const Value& d) {
  List out;
  for (const auto& [k, v] : d.map().items) out.push_back(Value::list({Value::string(k), v}));
  return Value::list(std::move(out));
}

Value dictsort(const Value& d, std::vector<Value> args) {
  Dict kw;
  std::vector<Value> pos;
  for (auto& a : args) {
    if (a.kind() == Kind::KwArgs)
      kw = a.map();
    else
      pos.push_back(a);
  }
  const Value* cs = arg_or_kw(pos, kw, 0, "case_sensitive");
  const Value* by = arg_or_kw(pos, kw, 1, "by");
  const Value* rev = arg_or_kw(pos, kw, 2, "reverse");
  if (cs && cs->kind() != Kind::Bool) fail("dictsort: case_sensitive must be a boolean");
  if (by && (!by->is_string() || (by->str() != "key" && by->str() != "value")))
    fail("dictsort: by must be 'key' or 'value'");
  if (rev && rev->kind() != Kind::Bool) fail("dictsort: reverse must be a boolean");
  const bool case_sensitive = cs && cs->as_bool(), reverse = rev && rev->as_bool();
  const size_t index = (by && by->str() == "value") ? 1 : 0;
  List items = dict_items(d).items();
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int r = compare_values(a.items()[index], b.items()[index], case_sensitive);
    return reverse ? r > 0 : r < 0;
  });
  return Value::list(std::move(items));
}

Value string_split(const std::string& s, const std::vector<Value>& args) {
  const Value sep = args.size() > 0 ? args[0] : Value::null();
  const Value maxsplit = args.size() > 1 ? args[1] : Value::integer(-1);
  if (!sep.is_string() && !sep.is_null()) fail("split(): separator must be a string or none");
  if (maxsplit.kind() != Kind::Int) fail("split(): maxsplit must be an integer");
  const double max = maxsplit.num();
  List out;
  if (sep.is_null()) {
    const std::string text = js_trim(s, true, false);
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i;  // skip whitespace
      while (j < text.size()) {
        size_t k = j;
        if (!is_js_space(next_code_point(text, k))) break;
        j = k;
      }
      if (j >= text.size()) break;
      size_t e = j;
      while (e < text.size()) {
        size_t k = e;
        if (is_js_space(next_code_point(text, k))) break;
        e = k;
      }
      if (max != -1 && double(out.size()) >= max) {
        out.push_back(Value::string(text.substr(j)));
        break;
      }
      out.push_back(Value::string(text.substr(j, e - j)));
      i = e;
    }
    return Value::list(std::move(out));
  }
  if (sep.str().empty()) fail("split(): empty separator");
  std::vector<std::string> parts;
  size_t b = 0;
  while (true) {
    const size_t f = s.find(sep.str(), b);
    if (f == std::string::npos) {
      parts.push_back(s.substr(b));
      break;
    }
    parts.push_back(s.substr(b, f - b));
    b = f + sep.str().size();
  }
  if (max != -1 && max >= 0 && double(parts.size()) > max) {
    std::string rest;
    for (size_t i = size_t(max); i < parts.size(); ++i) rest += (i > size_t(max) ? sep.str() : "") + parts[i];
    parts.resize(size_t(max));
    parts.push_back(rest);
  }
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::list(std::move(out));
}

Value affix_test(const std::string& s, const std::vector<Value>& args, bool prefix, const char* name) {
  if (args.empty()) fail("{}() requires an argument", name);
  auto check = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return prefix ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (args[0].is_string()) return Value::boolean(check(args[0].str()));
  if (args[0].kind() == Kind::List || args[0].kind() == Kind::Tuple) {
    for (const auto& e : args[0].items()) {
      if (!e.is_string()) fail("{}() tuple elements must be strings", name);
      if (check(e.str())) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  fail("{}() argument must be a string or a tuple of strings", name);
}

}  // namespace

Value builtin_member(const Value& obj, const std::string& name) {
  using Args = std::vector<Value>;
  if (obj.is_string()) {
    const std::string s = obj.str();
    auto method = [](auto f) { return Value::function([f](Args& a, Env&) -> Value { return f(a); }); };
    if (name == "length") return Value::integer(double(utf16_length(s)));
    if (name == "upper") return method([s](Args&) { return Value::string(map_case(s, true)); });
    if (name == "lower") return method([s](Args&) { return Value::string(map_case(s, false)); });
    if (name == "strip") return method([s](Args&) { return Value::string(js_trim(s, true, true)); });
    if (name == "lstrip") return method([s](Args&) { return Value::string(js_trim(s, true, false)); });
    if (name == "rstrip") return method([s](Args&) { return Value::string(js_trim(s, false, true)); });
    if (name == "title") return method([s](Args&) { return Value::string(title_case(s)); });
    if (name == "capitalize") return method([s](Args&) { return Value::string(capitalize(s)); });
    if (name == "startswith") return method([s](Args& a) { return affix_test(s, a, true, "startswith"); });
    if (name == "endswith") return method([s](Args& a) { return affix_test(s, a, false, "endswith"); });
    if (name == "split") return method([s](Args& a) { return string_split(s, a); });
    if (name == "replace")
      return method([s](Args& a) {
        if (a.size() < 2) fail("replace() requires at least two arguments");
        if (!a[0].is_string() || !a[1].is_string()) fail("replace() arguments must be strings");
        Value count = Value::null();
        if (a.size() > 2) {
          if (a[2].kind() == Kind::KwArgs) {
            const Value* c = a[2].map().find("count");
            if (c) count = *c;
          } else {
            count = a[2];
          }
        }
        if (count.kind() != Kind::Int && !count.is_null()) fail("replace() count must be an integer or none");
        return Value::string(replace_str(s, a[0].str(), a[1].str(), count.is_null() ? -1 : count.num()));
      });
    return Value::undefined();
  }
  if (obj.is_list()) {
    if (name == "length") return Value::integer(double(obj.items().size()));
    return Value::undefined();
  }
  if (obj.is_dict()) {
    const Value self = obj;
    if (name == "get")
      return Value::function([self](Args& a, Env&) -> Value {
        if (a.empty() || !a[0].is_string())
          fail("dict.get(): key must be a string, got {}", a.empty() ? "nothing" : a[0].type_name());
        if (const Value* v = self.map().find(a[0].str())) return *v;
        return a.size() > 1 ? a[1] : Value::null();
      });
    if (name == "items") return Value::function([self](Args&, Env&) { return dict_items(self); });
    if (name == "keys")
      return Value::function([self](Args&, Env&) {
        List l;
        for (const auto& kv : self.map().items) l.push_back(Value::string(kv.first));
        return Value::list(std::move(l));
      });
    if (name == "values")
      return Value::function([self](Args&, Env&) {
        List l;
        for (const auto& kv : self.map().items) l.push_back(kv.second);
        return Value::list(std::move(l));
      });
    if (name == "dictsort") return Value::function([self](Args& a, Env&) { return dictsort(self, a); });
  }
  return Value::undefined();
}

std::string strftime_js(const std::tm& t, const std::string& format) {
  static const char* months[] = {"January", "February", "March",     "April",   "May",      "June",
                                 "July",    "August",   "September", "October", "November", "December"};
  auto pad2 = [](int n) { return n < 10 ? "0" + std::to_string(n) : std::to_string(n); };
  const int mon = std::clamp(t.tm_mon, 0, 11);
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      const char c = format[i + 1];
      std::string rep;
      switch (c) {
        case 'Y': rep = std::to_string(t.tm_year + 1900); break;
        case 'm': rep = pad2(t.tm_mon + 1); break;
        case 'd': rep = pad2(t.tm_mday); break;
        case 'b': rep = std::string(months[mon]).substr(0, 3); break;
        case 'B': rep = months[mon]; break;
        case 'H': rep = pad2(t.tm_hour); break;
        case 'M': rep = pad2(t.tm_min); break;
        case '%': rep = "%"; break;
        default: out += format[i]; continue;
      }
      out += rep;
      ++i;
      continue;
    }
    out += format[i];
  }
  return out;
}

Value Interpreter::apply_test(const std::string& name, const Value& v, const Value* arg) const {
  const Kind k = v.kind();
  bool r;
  if (name == "boolean") r = k == Kind::Bool;
  else if (name == "callable") r = k == Kind::Function;
  else if (name == "odd" || name == "even") {
    if (k != Kind::Int) fail("test '{}' needs an integer, got a {}", name, v.type_name());
    const bool odd = std::fmod(v.num(), 2) != 0;
    r = name == "odd" ? odd : !odd;
  } else if (name == "false") r = k == Kind::Bool && !v.as_bool();
  else if (name == "true") r = k == Kind::Bool && v.as_bool();
  else if (name == "none") r = k == Kind::Null;
  else if (name == "string") r = k == Kind::String;
  else if (name == "number") r = v.is_number();
  else if (name == "integer") r = k == Kind::Int;
  else if (name == "iterable") r = k == Kind::List || k == Kind::String;  // tuples and dicts: no, as in the reference
  else if (name == "mapping") r = v.is_dict();
  else if (name == "sequence") r = v.is_list() || v.is_dict() || k == Kind::String;
  else if (name == "lower") r = k == Kind::String && map_case(v.str(), false) == v.str();
  else if (name == "upper") r = k == Kind::String && map_case(v.str(), true) == v.str();
  else if (name == "defined") r = k != Kind::Undefined;
  else if (name == "undefined") r = k == Kind::Undefined;
  else if (name == "equalto" || name == "eq") {
    if (!arg) fail("test '{}' needs a value to compare with", name);
    r = strict_equal(v, *arg);
  }
  else fail("unknown test '{}'", name);
  return Value::boolean(r);
}

Value Interpreter::apply_filter(const Value& v, const Node& filter, const EnvPtr& env) {
  if (filter.type == NodeType::Identifier) {
    const std::string& f = filter.str;
    if (f == "safe") return v;
    if (f == "tojson") return Value::string(v.to_json_text());
    if (v.is_list()) {
      const List& l = v.items();
      if (f == "list") return v;
      if (f == "first") return l.empty() ? Value::undefined() : l.front();
      if (f == "last") return l.empty() ? Value::undefined() : l.back();
      if (f == "length") return Value::integer(double(l.size()));
      if (f == "reverse") return Value::list(List(l.rbegin(), l.rend()));
      if (f == "sort") {
        List s = l;
        std::stable_sort(s.begin(), s.end(), [](const Value& a, const Value& b) { return compare_values(a, b, false) < 0; });
        return Value::list(std::move(s));
      }
      if (f == "join") {
        std::string out;
        for (const auto& e : l) out += e.raw_string();
        return Value::string(std::move(out));
      }
      if (f == "string") return Value::string(v.to_json_text({}, 0, false));
      if (f == "unique") {
        List out;
        for (const auto& e : l)
          if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return strict_equal(o, e); })) out.push_back(e);
        return Value::list(std::move(out));
      }
      fail("unknown filter '{}' for a list", f);
    }
    if (v.is_string()) {
      const std::string& s = v.str();
      if (f == "length") return Value::integer(double(utf16_length(s)));
      if (f == "upper") return Value::string(map_case(s, true));
      if (f == "lower") return Value::string(map_case(s, false));
      if (f == "title") return Value::string(title_case(s));
      if (f == "capitalize") return Value::string(capitalize(s));
      if (f == "trim") return Value::string(js_trim(s, true, true));
      if (f == "indent") return Value::string(indent_text(s, 4, false, false));
      if (f == "join" || f == "string") return v;
      if (f == "int") {
        const double d = js_parse_int(s);
        return Value::integer(std::isnan(d) ? 0 : d);
      }
      if (f == "float") {
        const double d = js_parse_float(s);
        return Value::floating(std::isnan(d) ? 0 : d);
      }
      fail("unknown filter '{}' for a string", f);
    }
    if (v.is_number()) {
      if (f == "abs") return v.kind() == Kind::Int ? Value::integer(std::fabs(v.num())) : Value::floating(std::fabs(v.num()));
      if (f == "int") return Value::integer(std::floor(v.num()));
      if (f == "float") return Value::floating(v.num());
      if (f == "string") return Value::string(v.to_output());
      fail("unknown filter '{}' for a number", f);
    }
    if (v.is_dict()) {
      if (f == "items") return dict_items(v);
      if (f == "length") return Value::integer(double(v.map().items.size()));
      const Value m = builtin_member(v, f);
      if (m.kind() == Kind::Function) {
        std::vector<Value> none;
        return m.fn()(none, *env);
      }
      fail("unknown filter '{}' for a dict", f);
    }
    if (v.kind() == Kind::Bool) {
      if (f == "bool") return v;
      if (f == "int") return Value::integer(v.num());
      if (f == "float") return Value::floating(v.num());
      if (f == "string") return Value::string(v.as_bool() ? "true" : "false");
      fail("unknown filter '{}' for a boolean", f);
    }
    fail("cannot apply filter '{}' to a {}", f, v.type_name());
  }
  if (filter.type != NodeType::Call || filter.a->type != NodeType::Identifier) fail("invalid filter expression");
  const std::string& f = filter.a->str;
  Dict kw;
  if (f == "tojson") {
    eval_args(filter.args, env, kw);
    JsonOptions opt;
    if (const Value* ind = kw.find("indent")) {
      if (ind->kind() != Kind::Int && !ind->is_null()) fail("tojson: indent must be an integer");
      opt.indent = ind->is_null() ? 0 : static_cast<int>(std::clamp(ind->num(), 0.0, 64.0));
    }
    if (const Value* ea = kw.find("ensure_ascii")) {
      if (ea->kind() != Kind::Bool) fail("tojson: ensure_ascii must be a boolean");
      opt.ensure_ascii = ea->as_bool();
    }
    if (const Value* sk = kw.find("sort_keys")) {
      if (sk->kind() != Kind::Bool) fail("tojson: sort_keys must be a boolean");
      opt.sort_keys = sk->as_bool();
    }
    if (const Value* sep = kw.find("separators")) {
      if (sep->is_list()) {
        const auto& p = sep->items();
        if (p.size() != 2 || !p[0].is_string() || !p[1].is_string())
          fail("tojson: separators must be a pair of strings");
        opt.has_separators = true;
        opt.item_sep = p[0].str();
        opt.key_sep = p[1].str();
      } else if (!sep->is_null()) {
        fail("tojson: separators must be a pair of strings");
      }
    }
    return Value::string(v.to_json_text(opt));
  }
  if (f == "join") {
    std::vector<std::string> parts;
    if (v.is_string())
      parts = utf8_chars(v.str());
    else if (v.is_list())
      for (const auto& e : v.items()) parts.push_back(e.raw_string());
    else
      fail("cannot apply filter 'join' to a {}", v.type_name());
    const auto args = eval_args(filter.args, env, kw);
    const Value* sep = arg_or_kw(args, kw, 0, "separator");
    if (sep && !sep->is_string()) fail("join: separator must be a string");
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i && sep ? sep->str() : "") + parts[i];
    return Value::string(std::move(out));
  }
  if (f == "int" || f == "float") {
    const auto args = eval_args(filter.args, env, kw);
    const Value* d = arg_or_kw(args, kw, 0, "default");
    const Value def = d ? *d : (f == "int" ? Value::integer(0) : Value::floating(0));
    if (v.is_string()) {
      const double x = f == "int" ? js_parse_int(v.str()) : js_parse_float(v.str());
      return std::isnan(x) ? def : (f == "int" ? Value::integer(x) : Value::floating(x));
    }
    if (v.is_number()) return v;
    if (v.kind() == Kind::Bool) return f == "int" ? Value::integer(v.num()) : Value::floating(v.num());
    fail("cannot apply filter '{}' to a {}", f, v.type_name());
  }
  if (f == "default" || f == "d") {
    const auto args = eval_args(filter.args, env, kw);
    const Value def = args.size() > 0 ? args[0] : Value::string("");
    const Value* b = arg_or_kw(args, kw, 1, "boolean");
    if (b && b->kind() != Kind::Bool) fail("default: the boolean flag must be a boolean");
    if (v.is_undefined() || (b && b->as_bool() && !v.truthy())) return def;
    return v;
  }
  if (v.is_list()) {
    const List& l = v.items();
    if (f == "sort") {
      const auto args = eval_args(filter.args, env, kw);
      const Value* rev = arg_or_kw(args, kw, 0, "reverse");
      const Value* cs = arg_or_kw(args, kw, 1, "case_sensitive");
      const Value* attr = arg_or_kw(args, kw, 2, "attribute");
      if (rev && rev->kind() != Kind::Bool) fail("sort: reverse must be a boolean");
      if (cs && cs->kind() != Kind::Bool) fail("sort: case_sensitive must be a boolean");
      if (attr && !attr->is_string() && attr->kind() != Kind::Int && !attr->is_null())
        fail("sort: attribute must be a string, integer or none");
      const bool reverse = rev && rev->as_bool(), case_sensitive = cs && cs->as_bool();
      auto key = [&](const Value& item) {
        if (!attr || attr->is_null()) return item;
        return attribute_path(item, attr->is_string() ? attr->str() : js_number_to_string(attr->num()));
      };
      List s = l;
      std::stable_sort(s.begin(), s.end(), [&](const Value& a, const Value& b) {
        const int r = compare_values(key(a), key(b), case_sensitive);
        return reverse ? r > 0 : r < 0;
      });
      return Value::list(std::move(s));
    }
    if (f == "selectattr" || f == "rejectattr") {
      const bool select = f == "selectattr";
      for (const auto& item : l)
        if (!item.is_attr_container()) fail("{} can only be applied to a list of dicts", f);
      for (const auto& a : filter.args)
        if (a->type != NodeType::StringLit) fail("the arguments of {} must be string literals", f);
      if (filter.args.empty()) fail("{} needs an attribute name", f);
      const std::string attr = filter.args[0]->str;
      const std::string test = filter.args.size() > 1 ? filter.args[1]->str : "";
      const Value arg = filter.args.size() > 2 ? Value::string(filter.args[2]->str) : Value::undefined();
      List out;
      for (const auto& item : l) {
        const Value* a = item.map().find(attr);
        bool r = false;
        if (a) r = test.empty() ? a->truthy() : apply_test(test, *a, &arg).truthy();
        if (r == select) out.push_back(item);
      }
      return Value::list(std::move(out));
    }
    if (f == "select" || f == "reject") {  // Jinja2's select/reject (not in the reference renderer)
      const auto args = eval_args(filter.args, env, kw);
      if (!args.empty() && !args[0].is_string()) fail("{}: the test name must be a string", f);
      List out;
      for (const auto& item : l) {
        const bool r = args.empty() ? item.truthy() : apply_test(args[0].str(), item, args.size() > 1 ? &args[1] : nullptr).truthy();
        if (r == (f == "select")) out.push_back(item);
      }
      return Value::list(std::move(out));
    }
    if (f == "map") {
      eval_args(filter.args, env, kw);
      const Value* attr = kw.find("attribute");
      if (!attr) fail("map: only map(attribute=...) is supported");
      if (!attr->is_string()) fail("map: attribute must be a string");
      const Value* def = kw.find("default");
      List out;
      for (const auto& item : l) {
        if (!item.is_attr_container()) fail("map: items must be dicts");
        const Value x = attribute_path(item, attr->str());
        out.push_back(x.is_undefined() && def ? *def : x);
      }
      return Value::list(std::move(out));
    }
    fail("unknown filter '{}' for a list", f);
  }
  if (v.is_string()) {
    if (f == "indent") {
      const auto args = eval_args(filter.args, env, kw);
      const Value* w = arg_or_kw(args, kw, 0, "width");
      if (w && w->kind() != Kind::Int) fail("indent: width must be an integer");
      const Value* first = arg_or_kw(args, kw, 1, "first");
      const Value* blank = arg_or_kw(args, kw, 2, "blank");
      return Value::string(indent_text(v.str(), w ? static_cast<int>(std::min(w->num(), 1024.0)) : 4,
                                       first && first->truthy(), blank && blank->truthy()));
    }
    if (f == "replace") {
      auto args = eval_args(filter.args, env, kw);
      args.push_back(Value::dict(kw, Kind::KwArgs));
      return builtin_member(v, "replace").fn()(args, *env);
    }
    fail("unknown filter '{}' for a string", f);
  }
  if (v.is_dict()) {
    const Value m = builtin_member(v, f);
    if (m.kind() == Kind::Function) {
      auto args = eval_args(filter.args, env, kw);
      if (!kw.items.empty()) args.push_back(Value::dict(kw, Kind::KwArgs));
      return m.fn()(args, *env);
    }
    fail("unknown filter '{}' for a dict", f);
  }
  fail("cannot apply filter '{}' to a {}", f, v.type_name());
}

}  // namespace perry::tokenizer::jinja
