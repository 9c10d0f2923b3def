// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered against a context with
// the usual chat-template variables (messages with tool calls, tools, flags). Any input must either
// render or raise perry::Error — never crash, hang on recursion or overflow the stack.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& fuzz_context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi \u00e9 \ud83d\ude00 {{ x }}"},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello", "reasoning_content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5]}}}]},
      {"role": "tool", "content": "{\"ok\": 1}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "<s>", "eos_token": "</s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const perry::tokenizer::ChatTemplate tmpl(std::string(reinterpret_cast<const char*>(data), size));
    const std::string out = tmpl.render_json(fuzz_context());
    volatile size_t sink = out.size();
    (void)sink;
  } catch (const perry::Error&) {
  }
  return 0;
}
