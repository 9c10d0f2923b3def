// Chat templates: renders a conversation with a checkpoint's Jinja chat template (the
// `chat_template` of tokenizer_config.json or a chat_template.jinja file).
//
// A small Jinja2-subset interpreter (jinja_lexer → jinja_parser → jinja_interp) whose output
// matches the reference renderer @huggingface/jinja byte for byte on the Qwen2.5/Qwen3/QwQ and
// Llama-3.x templates. HF's environment settings apply: trim_blocks and lstrip_blocks on, one
// trailing newline of the template dropped.
#pragma once
#include <nlohmann/json.hpp>

#include <ctime>
#include <memory>
#include <string>
#include <vector>

namespace perry::tokenizer {

namespace jinja {
struct Node;
class Value;
}  // namespace jinja

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(std::string source);  // parses once; throws perry::Error on syntax errors
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with context {messages, add_generation_prompt, bos_token, eos_token, ...extra}.
  // bos_token / eos_token default to "" unless extra_context sets them.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& extra_context = nlohmann::json::object()) const;
  // Full control: the caller gives the whole context (messages may carry tool calls etc.).
  // nlohmann::json sorts object keys; callers that need the JSON text's key order in tojson output
  // (tool schemas) pass an ordered_json instead.
  std::string render_json(const nlohmann::json& context) const;
  std::string render_json(const nlohmann::ordered_json& context) const;

  // The time strftime_now() reports (default: local time at each render). Fixing it makes
  // renders that print today's date (Llama 3.2) reproducible.
  void set_now(const std::tm& now);

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::unique_ptr<jinja::Node> program_;
  bool fixed_now_ = false;
  std::tm now_{};

  std::string render_value(const jinja::Value& context) const;
};

// The chat template and special tokens of a Hugging Face checkpoint directory: chat_template.jinja
// if present, else tokenizer_config.json's `chat_template` (a string, or a list of {name, template}
// where "default" is taken). bos/eos are read from tokenizer_config.json (string or {"content"}).
struct ChatTemplateConfig {
  std::string source;
  std::string bos_token;
  std::string eos_token;
};
ChatTemplateConfig load_chat_template_config(const std::string& model_dir);

}  // namespace perry::tokenizer
