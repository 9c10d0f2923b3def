#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace perry::tokenizer::jinja {

// ---------------------------------------------------------------- Dict

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& kv : items)
    if (kv.first == key) {  // JS Map.set keeps the original position
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

bool Dict::erase(std::string_view key) {
  for (auto it = items.begin(); it != items.end(); ++it)
    if (it->first == key) {
      items.erase(it);
      return true;
    }
  return false;
}

// ---------------------------------------------------------------- UTF-8 / JS string helpers

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return 0xFFFD;
  }
  if (len == 1) {
    ++i;
    return b0;
  }
  char32_t cp = b0 & (0xFF >> (len + 1));
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b >> 6) != 2) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  i += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // a lone surrogate leaves node as U+FFFD too
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_js_space(char32_t c) {
  // ECMAScript WhiteSpace + LineTerminator: what /\s/, trim() and trimEnd() remove.
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string js_trim(std::string_view s, bool start, bool end) {
  size_t b = 0, e = s.size();
  if (start) {
    while (b < e) {
      size_t j = b;
      if (!is_js_space(next_code_point(s, j))) break;
      b = j;
    }
  }
  if (end) {
    while (e > b) {
      size_t k = e - 1;  // step back to the lead byte of the last code point
      while (k > b && (static_cast<unsigned char>(s[k]) >> 6) == 2) --k;
      size_t j = k;
      if (!is_js_space(next_code_point(s, j))) break;
      e = k;
    }
  }
  return std::string(s.substr(b, e - b));
}

size_t utf16_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) n += next_code_point(s, i) >= 0x10000 ? 2 : 1;
  return n;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t b = i;
    next_code_point(s, i);
    out.emplace_back(s.substr(b, i - b));
  }
  return out;
}

std::string js_number_to_string(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return "0";
  // Shortest round-trip digits, then ECMAScript Number::toString layout rules.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  std::string out;
  if (sci[0] == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos))
    if (c != '.') digits += c;
  const int exp10 = std::atoi(std::string(sci.substr(epos + 1)).c_str());
  const int k = static_cast<int>(digits.size());
  const int n = exp10 + 1;
  if (k <= n && n <= 21) {
    out += digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(-n, '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += (n - 1 >= 0) ? "e+" : "e-";
    out += std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string js_json_quote(std::string_view s, bool ensure_ascii) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next_code_point(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      default: break;
    }
    auto esc = [&](unsigned u) {
      out += "\\u";
      for (int sh = 12; sh >= 0; sh -= 4) out += hex[(u >> sh) & 0xF];
    };
    if (c < 0x20) {
      esc(c);
    } else if (ensure_ascii && c >= 0x7F) {
      if (c >= 0x10000) {  // JS strings are UTF-16: astral characters escape as a surrogate pair
        esc(0xD800 + ((c - 0x10000) >> 10));
        esc(0xDC00 + ((c - 0x10000) & 0x3FF));
      } else {
        esc(c);
      }
    } else {
      append_utf8(out, c);
    }
  }
  return out + "\"";
}

// ---------------------------------------------------------------- Value

Value Value::null() {
  Value v;
  v.kind_ = Kind::Null;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.num_ = b ? 1 : 0;
  return v;
}
Value Value::integer(double x) {
  Value v;
  v.kind_ = Kind::Int;
  v.num_ = x;
  return v;
}
Value Value::floating(double x) {
  Value v;
  v.kind_ = Kind::Float;
  v.num_ = x;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.str_ = std::move(s);
  return v;
}
Value Value::list(List items, Kind kind) {
  Value v;
  v.kind_ = kind;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::dict(Dict d, Kind kind) {
  Value v;
  v.kind_ = kind;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::function(NativeFn fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.fn_ = std::make_shared<NativeFn>(std::move(fn));
  return v;
}

const void* Value::identity() const {
  if (list_) return list_.get();
  if (dict_) return dict_.get();
  if (fn_) return fn_.get();
  return nullptr;
}

namespace {

// JS orders an object's integer-like keys ("0", "17") first, ascending, then the rest by insertion.
bool is_array_index(const std::string& k) {
  if (k.empty() || k.size() > 10 || (k.size() > 1 && k[0] == '0')) return false;
  for (char c : k)
    if (c < '0' || c > '9') return false;
  return std::stoull(k) < 4294967295ull;
}

template <typename J>
Value from_json_impl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::null();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(double(j.template get<int64_t>()));
    case nlohmann::json::value_t::number_unsigned: return Value::integer(double(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: {
      const double d = j.template get<double>();
      // JSON.parse loses the int/float distinction; the reference then calls integral numbers ints.
      return (std::isfinite(d) && std::floor(d) == d) ? Value::integer(d) : Value::floating(d);
    }
    case nlohmann::json::value_t::string: return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json_impl(e));
      return Value::list(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      std::vector<std::pair<unsigned long long, std::string>> index_keys;
      for (auto it = j.begin(); it != j.end(); ++it)
        if (is_array_index(it.key())) index_keys.emplace_back(std::stoull(it.key()), it.key());
      std::sort(index_keys.begin(), index_keys.end());
      for (const auto& [n, k] : index_keys) d.items.emplace_back(k, from_json_impl(j.at(k)));
      for (auto it = j.begin(); it != j.end(); ++it)
        if (!is_array_index(it.key())) d.items.emplace_back(it.key(), from_json_impl(it.value()));
      return Value::dict(std::move(d));
    }
    default:
      fail("chat template context: unsupported JSON value (binary/discarded)");
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

nlohmann::ordered_json Value::to_json(int depth) const {
  if (depth > 512) fail("value nested too deeply (or cyclic) to convert to JSON");
  switch (kind_) {
    case Kind::Bool: return as_bool();
    case Kind::Int:
      if (std::isfinite(num_) && std::fabs(num_) < 9.2e18) return static_cast<int64_t>(num_);
      return num_;
    case Kind::Float: return num_;
    case Kind::String: return str_;
    case Kind::List:
    case Kind::Tuple: {
      auto a = nlohmann::ordered_json::array();
      for (const auto& e : *list_) a.push_back(e.to_json(depth + 1));
      return a;
    }
    case Kind::Dict:
    case Kind::KwArgs:
    case Kind::Namespace: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, v] : dict_->items) o[k] = v.to_json(depth + 1);
      return o;
    }
    default: return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::Null: return false;
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float: return num_ != 0 && !std::isnan(num_);
    case Kind::String: return !str_.empty();
    case Kind::List:
    case Kind::Tuple: return !list_->empty();
    case Kind::Dict:
    case Kind::KwArgs: return !dict_->items.empty();
    case Kind::Namespace:  // the reference's default `!!Map` is always true
    case Kind::Function: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::Null: return "none";
    case Kind::Bool: return "boolean";
    case Kind::Int: return "integer";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::KwArgs: return "keyword arguments";
    case Kind::Namespace: return "namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

std::string Value::to_output() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::Null: return "";
    case Kind::Bool: return as_bool() ? "true" : "false";
    case Kind::Int: return js_number_to_string(num_);
    case Kind::Float:
      if (num_ == 0 && std::signbit(num_)) return "-0.0";
      if (std::isfinite(num_) && std::floor(num_) == num_ && std::fabs(num_) < 1e21)
        return fmt::format("{:.1f}", num_);  // toFixed(1)
      return js_number_to_string(num_);
    case Kind::String: return str_;
    case Kind::List:
    case Kind::Dict:
    case Kind::Namespace: return to_json_text({}, 0, false);
    case Kind::Tuple:
    case Kind::KwArgs: fail("cannot convert a {} to text", type_name());
    case Kind::Function: return "[function]";
  }
  return "";
}

std::string Value::raw_string() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::Null: return "";
    case Kind::Bool: return as_bool() ? "true" : "false";
    case Kind::Int:
    case Kind::Float: return js_number_to_string(num_);
    case Kind::String: return str_;
    case Kind::List:
    case Kind::Tuple: {
      // Array.prototype.toString: elements' own toString joined by commas.
      std::string out;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ',';
        const Value& e = (*list_)[i];
        out += e.is_undefined() ? "undefined" : e.is_null() ? "null" : e.to_output();
      }
      return out;
    }
    case Kind::Dict:
    case Kind::KwArgs:
    case Kind::Namespace: return "[object Map]";
    case Kind::Function: return "[function]";
  }
  return "";
}

namespace {

// Approximates String.prototype.localeCompare (ICU root collation) for sort_keys: letters compare
// case-insensitively first, lower case before upper case on ties.
bool locale_less(const std::string& a, const std::string& b) {
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string la = lower(a), lb = lower(b);
  if (la != lb) return la < lb;
  return a > b;
}

}  // namespace

std::string Value::to_json_text(const JsonOptions& opt, int depth, bool undefined_as_null) const {
  // A namespace can hold itself (`set ns.v = ns`); the reference dies of stack overflow there.
  if (depth > 512) fail("value nested too deeply (or cyclic) to convert to JSON");
  std::string item_sep = opt.has_separators ? opt.item_sep : (opt.indent ? "," : ", ");
  std::string key_sep = opt.has_separators ? opt.key_sep : ": ";
  switch (kind_) {
    case Kind::Null: return "null";
    case Kind::Undefined: return undefined_as_null ? "null" : "undefined";
    case Kind::Bool: return as_bool() ? "true" : "false";
    case Kind::Int:
    case Kind::Float: return std::isfinite(num_) ? js_number_to_string(num_) : "null";
    case Kind::String: return js_json_quote(str_, opt.ensure_ascii);
    case Kind::List:
    case Kind::Dict:
    case Kind::Namespace: {
      const std::string indent_str(opt.indent > 0 ? opt.indent : 0, ' ');
      std::string base_pad = "\n";
      for (int i = 0; i < depth; ++i) base_pad += indent_str;
      const std::string child_pad = base_pad + indent_str;
      std::string out;
      if (kind_ == Kind::List) {
        out = "[";
        for (size_t i = 0; i < list_->size(); ++i) {
          if (i) out += item_sep;
          if (opt.indent) out += child_pad;
          out += (*list_)[i].to_json_text(opt, depth + 1, undefined_as_null);
        }
        if (opt.indent && !list_->empty()) out += base_pad;
        return out + "]";
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& kv : dict_->items) entries.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return locale_less(a->first, b->first); });
      out = "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (opt.indent) out += child_pad;
        out += js_json_quote(entries[i]->first, opt.ensure_ascii) + key_sep +
               entries[i]->second.to_json_text(opt, depth + 1, undefined_as_null);
      }
      if (opt.indent && !entries.empty()) out += base_pad;
      return out + "}";
    }
    case Kind::Tuple:
    case Kind::KwArgs:
    case Kind::Function: fail("cannot convert a {} to JSON", type_name());
  }
  return "";
}

namespace {

// Number(string) for loose equality: whitespace-trimmed decimal (or empty → 0), else NaN.
double js_to_number(const Value& v) {
  if (v.kind() == Kind::String) {
    const std::string t = js_trim(v.str(), true, true);
    if (t.empty()) return 0;
    if (t == "Infinity" || t == "+Infinity") return INFINITY;
    if (t == "-Infinity") return -INFINITY;
    if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
      char* end = nullptr;
      const double d = static_cast<double>(std::strtoull(t.c_str() + 2, &end, 16));
      return *end ? NAN : d;
    }
    for (char c : t)
      if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' ||
            c == '-'))
        return NAN;
    char* end = nullptr;
    const double d = std::strtod(t.c_str(), &end);
    return *end ? NAN : d;
  }
  return v.num();
}

bool is_primitive(const Value& v) {
  switch (v.kind()) {
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:
    case Kind::String: return true;
    default: return false;
  }
}

}  // namespace

bool strict_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.num() == b.num();
  if (a.kind() != b.kind()) {
    // List and tuple payloads are both JS arrays; dicts and kwargs both Maps: identity decides.
    if (a.identity() && a.identity() == b.identity()) return true;
    return false;
  }
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::Null: return true;
    case Kind::Bool: return a.as_bool() == b.as_bool();
    case Kind::String: return a.str() == b.str();
    default: return a.identity() == b.identity();
  }
}

bool loose_equal(const Value& a, const Value& b) {
  const bool an = a.is_null() || a.is_undefined(), bn = b.is_null() || b.is_undefined();
  if (an || bn) return an && bn;
  if (is_primitive(a) && is_primitive(b)) {
    if (a.kind() == b.kind() || (a.is_number() && b.is_number())) return strict_equal(a, b);
    return js_to_number(a) == js_to_number(b);
  }
  if (!is_primitive(a) && !is_primitive(b)) return a.identity() == b.identity();
  // Object vs primitive: JS converts the object to its string form first.
  if (a.kind() == Kind::Function || b.kind() == Kind::Function) return false;
  const Value& obj = is_primitive(a) ? b : a;
  const Value& prim = is_primitive(a) ? a : b;
  return loose_equal(Value::string(obj.raw_string()), prim);
}

}  // namespace perry::tokenizer::jinja
