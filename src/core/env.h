// Switches read from the environment (developer A/B toggles such as PERRY_NO_PDL, PERRY_PROFILE).
#pragma once
#include <cstdlib>
#include <cstring>
#include <string>

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

}  // namespace perry
