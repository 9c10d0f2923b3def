// The environment switches' parsers (core/env.h): unset and "" give the fallback, anything that
// is not an accepted value is an error naming the variable and what it accepts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/env.h"

namespace {

enum class Kind { A, B, C };

struct EnvVar {
  const char* name;
  EnvVar(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvVar() { unsetenv(name); }
};

TEST(Env, ChoiceParsesNamesAndRefusesOthers) {
  const char* n = "PERRY_TEST_ENV_CHOICE";
  unsetenv(n);
  auto pick = [&] { return perry::env_choice(n, Kind::A, {{"b", Kind::B}, {"c", Kind::C}}, "a note"); };
  EXPECT_EQ(pick(), Kind::A);
  {
    EnvVar v(n, "");
    EXPECT_EQ(pick(), Kind::A);
  }
  {
    EnvVar v(n, "c");
    EXPECT_EQ(pick(), Kind::C);
  }
  {
    EnvVar v(n, "B");  // names are exact
    try {
      pick();
      FAIL() << "no error for an unknown name";
    } catch (const perry::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("PERRY_TEST_ENV_CHOICE='B'"), std::string::npos) << m;
      EXPECT_NE(m.find("b, c"), std::string::npos) << m;
      EXPECT_NE(m.find("a note"), std::string::npos) << m;
    }
  }
}

TEST(Env, IntAndFlag) {
  const char* n = "PERRY_TEST_ENV_INT";
  unsetenv(n);
  EXPECT_EQ(perry::env_int(n, 7, 0, 10), 7);
  EXPECT_FALSE(perry::env_flag(n));
  EXPECT_TRUE(perry::env_flag(n, true));
  {
    EnvVar v(n, "3");
    EXPECT_EQ(perry::env_int(n, 7, 0, 10), 3);
    EXPECT_TRUE(perry::env_flag(n));
  }
  {
    EnvVar v(n, "0");
    EXPECT_FALSE(perry::env_flag(n, true));
  }
  {
    EnvVar v(n, "11");
    EXPECT_THROW(perry::env_int(n, 7, 0, 10), perry::Error);
  }
  {
    EnvVar v(n, "3x");
    EXPECT_THROW(perry::env_int(n, 7, 0, 10), perry::Error);
  }
}

}  // namespace
