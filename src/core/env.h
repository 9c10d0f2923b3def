// Switches read from the environment (developer A/B toggles such as PERRY_NO_PDL, PERRY_PROFILE).
#pragma once
#include <cstdlib>
#include <cstring>

namespace perry {

// True when the variable is set to something other than "" or "0".
inline bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && std::strcmp(e, "0") != 0;
}

}  // namespace perry
