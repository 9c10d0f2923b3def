#include "tokenizer/chat_template.h"

#include <filesystem>

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_value.h"

namespace perry::tokenizer {

ChatTemplate::ChatTemplate(std::string source) : source_(std::move(source)) {
  program_ = jinja::parse(jinja::tokenize(source_), source_);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

void ChatTemplate::set_now(const std::tm& now) {
  now_ = now;
  fixed_now_ = true;
}

std::string ChatTemplate::render_value(const jinja::Value& context) const {
  std::tm now = now_;
  if (!fixed_now_) {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &now);
  }
  // The AST is read-only during rendering, so one ChatTemplate serves concurrent renders.
  jinja::Interpreter interp(*program_, source_, now);
  return interp.render(context);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra_context) const {
  PERRY_CHECK(extra_context.is_object(), "chat template extra context must be a JSON object, got {}",
              extra_context.type_name());
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  auto msgs = nlohmann::ordered_json::array();
  for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  ctx["messages"] = std::move(msgs);
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = "";
  ctx["eos_token"] = "";
  for (auto it = extra_context.begin(); it != extra_context.end(); ++it) ctx[it.key()] = it.value();
  return render_value(jinja::Value::from_json(ctx));
}

std::string ChatTemplate::render_json(const nlohmann::json& context) const {
  return render_value(jinja::Value::from_json(context));
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& context) const {
  return render_value(jinja::Value::from_json(context));
}

namespace {

std::string token_text(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const auto& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";  // null: the model has no such token
}

}  // namespace

ChatTemplateConfig load_chat_template_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  ChatTemplateConfig out;
  const fs::path dir(model_dir);
  const fs::path cfg_path = dir / "tokenizer_config.json";
  nlohmann::json cfg = nlohmann::json::object();
  if (fs::exists(cfg_path)) {
    try {
      cfg = nlohmann::json::parse(read_text_file(cfg_path.string()));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", cfg_path.string(), e.what());
    }
    out.bos_token = token_text(cfg, "bos_token");
    out.eos_token = token_text(cfg, "eos_token");
  }
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    out.source = read_text_file(jinja_path.string());
    return out;
  }
  if (cfg.contains("chat_template")) {
    const auto& ct = cfg["chat_template"];
    if (ct.is_string()) {
      out.source = ct.get<std::string>();
      return out;
    }
    if (ct.is_array()) {
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
          out.source = e["template"].get<std::string>();
          return out;
        }
      fail("{}: chat_template is a list without a \"default\" entry", cfg_path.string());
    }
    fail("{}: chat_template must be a string or a list of {{name, template}}", cfg_path.string());
  }
  fail("{}: no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template)", model_dir);
}

}  // namespace perry::tokenizer
