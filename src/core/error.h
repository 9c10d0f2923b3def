// Errors: every user-facing failure is a perry::Error with a message that names the file or
// input and says what to do. The CLI catches it, prints it and exits non-zero.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace perry {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace perry

// PERRY_CHECK(cond, "fmt {}", args...) — throws perry::Error when cond is false.
#define PERRY_CHECK(cond, ...)          \
  do {                                  \
    if (!(cond)) ::perry::fail(__VA_ARGS__); \
  } while (0)
