// Switches read from the environment (developer A/B toggles such as PERRY_NO_PDL, PERRY_PROFILE).
#pragma once
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/error.h"

namespace perry {

// True when the variable is set to something other than "" or "0".
inline bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && std::strcmp(e, "0") != 0;
}
// The same, with `fallback` when the variable is unset or "" (a switch that is on by default).
inline bool env_flag(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  return e && *e ? std::strcmp(e, "0") != 0 : fallback;
}
// An integer in [lo, hi]; `fallback` when unset or "". Anything else is an error naming the variable.
inline int env_int(const char* name, int fallback, int lo, int hi) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  if (*end || v < lo || v > hi)
    throw Error(std::string(name) + "='" + e + "': expected an integer from " + std::to_string(lo) + " to " +
                std::to_string(hi));
  return int(v);
}

// One of named values: `fallback` when unset or ""; an unknown name is an error listing the names
// (and `note`, e.g. "lab only: wrong outputs"). Parses an A/B switch into its enum at the edge.
template <typename T>
T env_choice(const char* name, T fallback, std::initializer_list<std::pair<const char*, T>> choices,
             const char* note = nullptr) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  std::string names;
  for (const auto& [key, value] : choices) {
    if (std::strcmp(e, key) == 0) return value;
    names += (names.empty() ? "" : ", ") + std::string(key);
  }
  throw Error(std::string(name) + "='" + e + "': expected one of " + names + (note ? std::string(" (") + note + ")" : ""));
}

}  // namespace perry
