// Runtime values of the Jinja-subset interpreter used for chat templates.
//
// The reference renderer is @huggingface/jinja (JavaScript), and chat templates must render byte for
// byte like it. Its value model is therefore mirrored here rather than Python's: numbers are doubles
// tagged int/float (as JS numbers are), lists and dicts are shared by reference (identity equality,
// namespace mutation visible through every alias), dicts keep insertion order, `==` follows JS loose
// equality on primitives. Strings are UTF-8.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace perry::tokenizer::jinja {

enum class Kind { Undefined, Null, Bool, Int, Float, String, List, Tuple, Dict, KwArgs, Namespace, Function };

class Value;
class Env;
using List = std::vector<Value>;
// A native function receives positional arguments; keyword arguments, when present, come last as
// one Value of kind KwArgs (the calling convention of the reference renderer).
using NativeFn = std::function<Value(std::vector<Value>& args, Env& env)>;

// Insertion-ordered string-keyed map. Chat-template dicts are small, so a vector with linear lookup
// beats hashing and keeps the order for tojson and iteration.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
  bool erase(std::string_view key);
};

struct JsonOptions {
  int indent = 0;  // 0 = single line (the reference treats indent 0 like none)
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_sep, key_sep;
};

class Value {
 public:
  Value() = default;  // undefined
  static Value undefined() { return Value(); }
  static Value null();
  static Value boolean(bool b);
  static Value integer(double v);
  static Value floating(double v);
  static Value string(std::string s);
  static Value list(List items, Kind kind = Kind::List);
  static Value dict(Dict d, Kind kind = Kind::Dict);
  static Value function(NativeFn fn);

  // JSON → value like JSON.parse + the reference's conversion: integral numbers become ints.
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);
  nlohmann::ordered_json to_json(int depth = 0) const;  // undefined → null, functions → null

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_list() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  // Dict-like: plain dicts and keyword-argument bundles (both are "mapping" in the reference).
  bool is_dict() const { return kind_ == Kind::Dict || kind_ == Kind::KwArgs; }
  bool is_attr_container() const { return is_dict() || kind_ == Kind::Namespace; }

  bool as_bool() const { return num_ != 0; }
  double num() const { return num_; }
  const std::string& str() const { return str_; }
  List& items() const { return *list_; }
  Dict& map() const { return *dict_; }
  const NativeFn& fn() const { return *fn_; }
  const void* identity() const;  // containers/functions compare by identity

  bool truthy() const;
  // Text a value renders as in {{ }} (the reference's toString).
  std::string to_output() const;
  // JS `value.toString()` of the raw payload, used by `~`, string `+` and join.
  std::string raw_string() const;
  // The reference's toJSON; `undefined_as_null` false prints undefined as `undefined` (display).
  std::string to_json_text(const JsonOptions& opt = {}, int depth = 0, bool undefined_as_null = true) const;
  std::string type_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  double num_ = 0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<NativeFn> fn_;
};

bool loose_equal(const Value& a, const Value& b);   // JS `a.value == b.value`
bool strict_equal(const Value& a, const Value& b);  // JS `a.value === b.value`

// Helpers with JavaScript string semantics on UTF-8 text.
std::string js_number_to_string(double v);  // Number.prototype.toString()
std::string js_json_quote(std::string_view s, bool ensure_ascii);  // JSON.stringify(string)
bool is_js_space(char32_t c);
std::string js_trim(std::string_view s, bool start, bool end);
size_t utf16_length(std::string_view s);
std::vector<std::string> utf8_chars(std::string_view s);  // one string per code point
void append_utf8(std::string& out, char32_t cp);
// Decodes one code point at s[i], advancing i; invalid bytes decode as U+FFFD.
char32_t next_code_point(std::string_view s, size_t& i);

}  // namespace perry::tokenizer::jinja
