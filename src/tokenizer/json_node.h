// A view of one node of a parsed tokenizer.json that knows its own JSON path, so every
// configuration error names the file and the exact place ("$.pre_tokenizer.pretokenizers[1].type")
// instead of surfacing as a nlohmann type_error or, worse, a crash.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace perry::tokenizer {

class JsonNode {
 public:
  JsonNode(const nlohmann::json& j, std::string path, const std::string& origin)
      : j_(&j), path_(std::move(path)), origin_(&origin) {}

  const nlohmann::json& raw() const { return *j_; }
  const std::string& path() const { return path_; }
  const std::string& origin() const { return *origin_; }

  bool is_null() const { return j_->is_null(); }
  bool is_object() const { return j_->is_object(); }
  bool is_array() const { return j_->is_array(); }
  bool is_string() const { return j_->is_string(); }

  // Object member that must exist.
  JsonNode at(std::string_view key) const {
    require_object();
    auto it = j_->find(key);
    if (it == j_->end()) fail_here("missing required field \"{}\"", key);
    return JsonNode(*it, child_path(key), *origin_);
  }
  // Object member that may be absent (absent and null both give nullopt).
  std::optional<JsonNode> find(std::string_view key) const {
    require_object();
    auto it = j_->find(key);
    if (it == j_->end() || it->is_null()) return std::nullopt;
    return JsonNode(*it, child_path(key), *origin_);
  }
  size_t size() const {
    require_array();
    return j_->size();
  }
  JsonNode operator[](size_t i) const {
    require_array();
    return JsonNode((*j_)[i], path_ + "[" + std::to_string(i) + "]", *origin_);
  }

  std::string str() const {
    if (!j_->is_string()) fail_here("expected a string, got {}", j_->type_name());
    return j_->get<std::string>();
  }
  bool boolean() const {
    if (!j_->is_boolean()) fail_here("expected true/false, got {}", j_->type_name());
    return j_->get<bool>();
  }
  int64_t integer() const {
    if (!j_->is_number_integer()) fail_here("expected an integer, got {}", j_->type_name());
    return j_->get<int64_t>();
  }
  // Token ids must fit the int32 ids the engine uses everywhere.
  int32_t token_id() const {
    int64_t v = integer();
    if (v < 0 || v > INT32_MAX) fail_here("token id {} out of range [0, 2^31)", v);
    return static_cast<int32_t>(v);
  }
  bool bool_or(std::string_view key, bool dflt) const {
    auto n = find(key);
    return n ? n->boolean() : dflt;
  }

  void require_object() const {
    if (!j_->is_object()) fail_here("expected an object, got {}", j_->type_name());
  }
  void require_array() const {
    if (!j_->is_array()) fail_here("expected an array, got {}", j_->type_name());
  }

  template <typename... Args>
  [[noreturn]] void fail_here(fmt::format_string<Args...> f, Args&&... args) const {
    perry::fail("{}: {}: {}", *origin_, path_, fmt::format(f, std::forward<Args>(args)...));
  }

 private:
  std::string child_path(std::string_view key) const {
    return path_ + "." + std::string(key);
  }
  const nlohmann::json* j_;
  std::string path_;
  const std::string* origin_;
};

}  // namespace perry::tokenizer
