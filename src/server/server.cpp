#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "tokenizer/chat_template.h"

namespace perry::server {

using json = nlohmann::json;

namespace {

// An error the client caused (or 503 while stopping): becomes an OpenAI error object.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string msg, std::string param = "", std::string code = "",
           std::string type = "invalid_request_error")
      : std::runtime_error(std::move(msg)), status(status), param(std::move(param)), code(std::move(code)),
        type(std::move(type)) {}
  int status;
  std::string param, code, type;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& msg, const std::string& type, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", msg},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& type = "invalid_request_error",
                const std::string& param = "", const std::string& code = "") {
  res.status = status;
  res.set_content(dump(error_body(msg, type, param, code)), "application/json");
}

// ---- typed field access: wrong types are 400s naming the field --------------------------------
bool present(const json& j, const char* k) { return j.contains(k) && !j[k].is_null(); }

std::optional<double> get_number(const json& j, const char* k) {
  if (!present(j, k)) return std::nullopt;
  if (!j[k].is_number()) throw ApiError(400, fmt::format("'{}' must be a number", k), k);
  return j[k].get<double>();
}

std::optional<int64_t> get_int(const json& j, const char* k) {
  if (!present(j, k)) return std::nullopt;
  const json& v = j[k];
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) throw ApiError(400, fmt::format("'{}' is too large", k), k);
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) return int64_t(d);
  }
  throw ApiError(400, fmt::format("'{}' must be an integer", k), k);
}

std::optional<bool> get_bool(const json& j, const char* k) {
  if (!present(j, k)) return std::nullopt;
  if (!j[k].is_boolean()) throw ApiError(400, fmt::format("'{}' must be a boolean", k), k);
  return j[k].get<bool>();
}

void unsupported(const char* k, const std::string& why) {
  throw ApiError(400, fmt::format("'{}' is not supported by this server{}", k, why), k, "unsupported_parameter");
}

struct Parsed {
  GenRequest gen;
  bool stream = false, include_usage = false;
};

enum class Kind { Chat, Completion };

}  // namespace

struct Server::Impl {
  model::Model& model;
  const tokenizer::Tokenizer& tok;
  std::unique_ptr<tokenizer::ChatTemplate> chat;
  std::mutex chat_mu;
  tokenizer::ChatTemplateConfig chat_cfg;
  io::GenerationDefaults gen_defaults;
  std::vector<int32_t> eos_ids, chat_eos_ids;
  std::atomic<uint64_t> next_id{1};
  std::time_t started = std::time(nullptr);

  Impl(model::Model& m, const tokenizer::Tokenizer& t) : model(m), tok(t) {}
  Parsed parse(const json& body, Kind kind, int64_t ctx, const std::string& served_name);
  std::vector<int32_t> chat_prompt(const json& messages);
};

std::vector<int32_t> Server::Impl::chat_prompt(const json& messages) {
  if (!chat) throw ApiError(400, "this model has no chat template: use /v1/completions with a plain prompt", "messages");
  if (!messages.is_array() || messages.empty())
    throw ApiError(400, "'messages' must be a non-empty array of {role, content} objects", "messages");
  std::vector<tokenizer::ChatMessage> msgs;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw ApiError(400, where + " must be an object", where);
    if (!m.contains("role") || !m["role"].is_string()) throw ApiError(400, where + ".role must be a string", where + ".role");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant")
      throw ApiError(400, fmt::format("{}.role '{}' is not supported (use system, user or assistant)", where, role), where + ".role");
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it.key() != "role" && it.key() != "content" && it.key() != "name")
        throw ApiError(400, fmt::format("{}.{} is not supported", where, it.key()), where + "." + it.key());
    std::string content;
    const json c = m.value("content", json(nullptr));
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw ApiError(400, where + ".content: only parts of type \"text\" with a string \"text\" are supported", where + ".content");
        content += part["text"].get<std::string>();
      }
    } else if (!(c.is_null() && role == "assistant")) {
      throw ApiError(400, where + ".content must be a string or an array of text parts", where + ".content");
    }
    msgs.push_back({role, content});
  }
  json extra = {{"bos_token", chat_cfg.bos_token}, {"eos_token", chat_cfg.eos_token}};
  std::string text;
  try {
    std::lock_guard lk(chat_mu);  // the template interpreter is not documented as thread-safe
    text = chat->render(msgs, true, extra);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the chat template rejected the messages: {}", e.what()), "messages");
  }
  return tok.encode(text, false);  // the template already placed the special tokens
}

Parsed Server::Impl::parse(const json& body, Kind kind, int64_t ctx, const std::string& served_name) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  static const std::set<std::string> common = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p",
                                               "repetition_penalty", "seed", "stop", "n", "stream", "stream_options",
                                               "user", "frequency_penalty", "presence_penalty", "logprobs",
                                               "ignore_eos", "metadata", "store", "logit_bias", "service_tier"};
  static const std::set<std::string> chat_only = {"messages", "max_completion_tokens", "top_logprobs", "tools",
                                                  "tool_choice", "response_format", "parallel_tool_calls"};
  static const std::set<std::string> completion_only = {"prompt", "echo", "best_of", "suffix"};
  const auto& own = kind == Kind::Chat ? chat_only : completion_only;
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!common.count(it.key()) && !own.count(it.key()))
      throw ApiError(400, fmt::format("unrecognized request field '{}'", it.key()), it.key(), "unknown_parameter");

  if (present(body, "model") && !body["model"].is_string()) throw ApiError(400, "'model' must be a string", "model");
  // Fields whose semantics this server does not implement: refuse rather than silently ignore.
  for (const char* k : {"frequency_penalty", "presence_penalty"})
    if (auto v = get_number(body, k); v && *v != 0) unsupported(k, " (use repetition_penalty)");
  if (present(body, "logprobs") && body["logprobs"] != false && body["logprobs"] != 0) unsupported("logprobs", "");
  if (present(body, "top_logprobs") && body["top_logprobs"] != 0) unsupported("top_logprobs", "");
  if (present(body, "logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty())) unsupported("logit_bias", "");
  if (present(body, "tools") && !(body["tools"].is_array() && body["tools"].empty())) unsupported("tools", "");
  if (present(body, "tool_choice") && body["tool_choice"] != "none") unsupported("tool_choice", "");
  if (present(body, "response_format") && !(body["response_format"].is_object() && body["response_format"].value("type", "") == "text"))
    unsupported("response_format", " (only {\"type\": \"text\"})");
  if (auto e = get_bool(body, "echo"); e && *e) unsupported("echo", "");
  if (auto b = get_int(body, "best_of"); b && *b != 1) unsupported("best_of", " (only 1)");
  if (present(body, "suffix") && !(body["suffix"].is_string() && body["suffix"].get<std::string>().empty())) unsupported("suffix", "");
  if (auto n = get_int(body, "n"); n && *n != 1) throw ApiError(400, fmt::format("'n' must be 1 (got {}): this server returns one choice", *n), "n");

  Parsed p;
  p.stream = get_bool(body, "stream").value_or(false);
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    if (!p.stream) throw ApiError(400, "'stream_options' is only allowed with stream: true", "stream_options");
    p.include_usage = get_bool(so, "include_usage").value_or(false);
  }

  // Prompt.
  if (kind == Kind::Chat) {
    if (!body.contains("messages")) throw ApiError(400, "'messages' is required", "messages");
    p.gen.prompt = chat_prompt(body["messages"]);
  } else {
    if (!body.contains("prompt")) throw ApiError(400, "'prompt' is required", "prompt");
    const json& pr = body["prompt"];
    std::string text;
    if (pr.is_string()) text = pr.get<std::string>();
    else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) text = pr[0].get<std::string>();
    else throw ApiError(400, "'prompt' must be a string (one prompt per request)", "prompt");
    p.gen.prompt = tok.encode(text, true);
  }
  const int64_t n_prompt = int64_t(p.gen.prompt.size());
  if (n_prompt == 0) throw ApiError(400, "the prompt is empty (it encodes to no tokens)", kind == Kind::Chat ? "messages" : "prompt");
  if (n_prompt >= ctx)
    throw ApiError(400,
                   fmt::format("the prompt is {} tokens but the context holds {} tokens (prompt plus at least one "
                               "generated token): shorten the prompt",
                               n_prompt, ctx),
                   kind == Kind::Chat ? "messages" : "prompt", "context_length_exceeded");

  // Token limit: chat defaults to the rest of the context, completions to 16 (as OpenAI).
  std::optional<int64_t> mt = get_int(body, "max_tokens");
  if (kind == Kind::Chat)
    if (auto mct = get_int(body, "max_completion_tokens")) mt = mct;
  if (mt && *mt < 0) throw ApiError(400, fmt::format("'max_tokens' must be >= 0, got {}", *mt), "max_tokens");
  p.gen.max_new_tokens = mt ? *mt : (kind == Kind::Chat ? ctx - n_prompt : 16);

  // Sampling: request > generation_config.json > OpenAI defaults.
  auto& s = p.gen.sampling;
  const auto& d = gen_defaults;
  const double default_temp = d.temperature ? *d.temperature : (d.do_sample && !*d.do_sample ? 0.0 : 1.0);
  s.temperature = get_number(body, "temperature").value_or(d.do_sample && !*d.do_sample ? 0.0 : default_temp);
  s.top_p = get_number(body, "top_p").value_or(d.top_p.value_or(1.0));
  s.top_k = get_int(body, "top_k").value_or(d.top_k.value_or(0));
  s.min_p = get_number(body, "min_p").value_or(d.min_p.value_or(0.0));
  s.repetition_penalty = get_number(body, "repetition_penalty").value_or(d.repetition_penalty.value_or(1.0));
  if (!(s.temperature >= 0 && s.temperature <= 100)) throw ApiError(400, "'temperature' must be in [0, 100]", "temperature");
  if (!(s.top_p > 0 && s.top_p <= 1)) throw ApiError(400, "'top_p' must be in (0, 1]", "top_p");
  if (s.top_k < 0) throw ApiError(400, "'top_k' must be >= 0 (0 = off)", "top_k");
  if (!(s.min_p >= 0 && s.min_p < 1)) throw ApiError(400, "'min_p' must be in [0, 1)", "min_p");
  if (!(s.repetition_penalty > 0 && s.repetition_penalty <= 100)) throw ApiError(400, "'repetition_penalty' must be in (0, 100]", "repetition_penalty");
  if (auto seed = get_int(body, "seed")) s.seed = uint64_t(*seed);
  else s.seed = std::random_device{}();

  // Stop strings.
  if (present(body, "stop")) {
    const json& st = body["stop"];
    if (st.is_string()) p.gen.stop_strings.push_back(st.get<std::string>());
    else if (st.is_array()) {
      for (const json& e : st) {
        if (!e.is_string()) throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
        p.gen.stop_strings.push_back(e.get<std::string>());
      }
    } else throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
    // Every generated piece is searched for every stop string: keep that cost bounded.
    if (p.gen.stop_strings.size() > 16) throw ApiError(400, "'stop' may hold at most 16 strings", "stop");
    for (const auto& e : p.gen.stop_strings)
      if (e.empty() || e.size() > 256) throw ApiError(400, "'stop' strings must be 1 to 256 bytes long", "stop");
  }
  if (!get_bool(body, "ignore_eos").value_or(false)) p.gen.eos_ids = kind == Kind::Chat ? chat_eos_ids : eos_ids;
  (void)served_name;  // any model name is accepted: one model is served
  return p;
}

Server::Server(model::Model& model, const tokenizer::Tokenizer& tok, ServerOptions opts)
    : opts_(std::move(opts)), impl_(std::make_unique<Impl>(model, tok)) {
  const auto& cfg = model.config();
  if (opts_.ctx <= 0) opts_.ctx = std::min<int64_t>(4096, cfg.max_position_embeddings);
  PERRY_CHECK(opts_.ctx <= cfg.max_position_embeddings, "--ctx {} exceeds the model's maximum context {}", opts_.ctx,
              cfg.max_position_embeddings);
  if (opts_.model_name.empty())
    opts_.model_name = opts_.model_dir.empty() ? "perry" : std::filesystem::path(opts_.model_dir).lexically_normal().filename().string();
  if (opts_.model_name.empty()) opts_.model_name = "perry";
  // Token ids that end a sequence: generation_config.json + config.json, and for chat the
  // template's end-of-turn token (as `perry run --chat` does).
  if (!opts_.model_dir.empty()) {
    impl_->gen_defaults = io::Checkpoint::open(opts_.model_dir).generation_defaults();
    impl_->chat_cfg = tokenizer::load_chat_template_config(opts_.model_dir);
    if (!impl_->chat_cfg.source.empty()) impl_->chat = std::make_unique<tokenizer::ChatTemplate>(impl_->chat_cfg.source);
  }
  auto add = [](std::vector<int32_t>& v, int32_t id) {
    if (std::find(v.begin(), v.end(), id) == v.end()) v.push_back(id);
  };
  for (int32_t e : impl_->gen_defaults.eos_token_ids) add(impl_->eos_ids, e);
  for (int32_t e : cfg.eos_token_ids) add(impl_->eos_ids, e);
  impl_->chat_eos_ids = impl_->eos_ids;
  for (const std::string& t : {impl_->chat_cfg.eos_token, std::string("<|im_end|>"), std::string("<|eot_id|>")})
    if (!t.empty())
      if (auto id = tok.token_id(t)) add(impl_->chat_eos_ids, *id);

  SchedulerOptions so;
  so.n_slots = opts_.n_parallel;
  so.ctx = opts_.ctx;
  so.prefill_chunk = opts_.prefill_chunk;
  so.max_batch_tokens = std::max(opts_.max_batch_tokens, opts_.n_parallel);
  if (opts_.log_requests)
    so.on_finish = [](const GenRequest& r, const RequestResult& res) {
      std::fprintf(stderr,
                   "[perry serve] %s prompt %lld | completion %lld tok | queue %.1f ms | TTFT %.1f ms | %.1f tok/s | "
                   "total %.1f ms | finish %s%s%s\n",
                   r.id.c_str(), (long long)res.prompt_tokens, (long long)res.completion_tokens, res.queue_s * 1e3,
                   res.ttft_s * 1e3, res.decode_tok_s(), res.total_s * 1e3,
                   std::string(runtime::finish_reason_name(res.finish)).c_str(), res.error.empty() ? "" : " | error: ",
                   res.error.c_str());
    };
  sched_ = std::make_unique<Scheduler>(model, tok, so);
  http_ = std::make_unique<httplib::Server>();
  setup_routes();
}

namespace {

json usage_json(const RequestResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

// OpenAI has no "cancelled": a sequence cut short by shutdown reports "length".
std::string finish_name(runtime::FinishReason f) {
  return f == runtime::FinishReason::Cancelled ? "length" : std::string(runtime::finish_reason_name(f));
}

// State of one streaming response, shared by httplib's content provider and releaser.
struct StreamState {
  std::shared_ptr<RequestChannel> ch;
  std::string id, object, model;
  std::time_t created = 0;
  bool chat = true, include_usage = false, sent_role = false;

  json chunk(const json& choice) const {
    json j = {{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"choices", json::array({choice})}};
    if (include_usage) j["usage"] = nullptr;
    return j;
  }
  json text_choice(const std::string& text, const json& finish) const {
    if (chat) return {{"index", 0}, {"delta", text.empty() && finish.is_null() ? json{{"role", "assistant"}, {"content", ""}}
                                                : finish.is_null() ? json{{"content", text}} : json::object()},
                      {"logprobs", nullptr}, {"finish_reason", finish}};
    return {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}};
  }
};

bool sse(httplib::DataSink& sink, const std::string& payload) {
  const std::string ev = "data: " + payload + "\n\n";
  return sink.write(ev.data(), ev.size());
}

}  // namespace

void Server::handle_generate(const std::string& req_body, httplib::Response& res, bool chat) {
  const std::string id = fmt::format("{}-{:x}", chat ? "chatcmpl" : "cmpl", impl_->next_id.fetch_add(1));
  const std::time_t created = std::time(nullptr);
  std::shared_ptr<RequestChannel> ch;
  Parsed p;
  try {
    if (!sched_->accepting()) throw ApiError(503, "the server is shutting down", "", "", "server_error");
    json body;
    try {
      body = json::parse(req_body);
    } catch (const json::parse_error& e) {
      throw ApiError(400, fmt::format("the request body is not valid JSON (UTF-8): {}", e.what()), "", "invalid_json");
    }
    p = impl_->parse(body, chat ? Kind::Chat : Kind::Completion, opts_.ctx, opts_.model_name);
    p.gen.id = id;
    ch = sched_->submit(std::move(p.gen));
  } catch (const ApiError& e) {
    return send_error(res, e.status, e.what(), e.type, e.param, e.code);
  } catch (const Error& e) {
    // From the tokenizer (invalid UTF-8 in a prompt) or the scheduler's own checks.
    if (!sched_->accepting()) return send_error(res, 503, e.what(), "server_error");
    return send_error(res, 400, e.what());
  } catch (const json::exception& e) {
    return send_error(res, 400, fmt::format("malformed request: {}", e.what()));
  }

  if (!p.stream) {
    std::string text;
    while (!ch->next(&text, std::chrono::milliseconds(1000))) {
    }
    const RequestResult& r = ch->result();
    if (!r.error.empty()) return send_error(res, 500, "generation failed: " + r.error, "server_error");
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_name(r.finish)}};
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
    else choice["text"] = text;
    json out = {{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", opts_.model_name},
                {"choices", json::array({choice})},
                {"usage", usage_json(r)}};
    res.set_content(dump(out), "application/json");
    return;
  }

  auto st = std::make_shared<StreamState>();
  st->ch = ch;
  st->id = id;
  st->object = chat ? "chat.completion.chunk" : "text_completion";
  st->model = opts_.model_name;
  st->created = created;
  st->chat = chat;
  st->include_usage = p.include_usage;
  res.set_header("Cache-Control", "no-cache");
  open_streams_.fetch_add(1);
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        // A failed write means the client went away: cancel its sequence and stop.
        auto fail_write = [&] {
          st->ch->cancel();
          return false;
        };
        if (st->chat && !st->sent_role) {
          st->sent_role = true;
          if (!sse(sink, dump(st->chunk(st->text_choice("", nullptr))))) return fail_write();
        }
        std::string text;
        const bool done = st->ch->next(&text, std::chrono::milliseconds(200));
        if (!text.empty() && !sse(sink, dump(st->chunk(st->text_choice(text, nullptr))))) return fail_write();
        if (!done) return true;
        const RequestResult& r = st->ch->result();
        if (!r.error.empty()) {
          sse(sink, dump(error_body("generation failed: " + r.error, "server_error", "", "")));
        } else {
          if (!sse(sink, dump(st->chunk(st->text_choice("", finish_name(r.finish)))))) return fail_write();
          if (st->include_usage) {
            json u = {{"id", st->id}, {"object", st->object}, {"created", st->created}, {"model", st->model},
                      {"choices", json::array()}, {"usage", usage_json(r)}};
            if (!sse(sink, dump(u))) return fail_write();
          }
        }
        if (!sse(sink, "[DONE]")) return fail_write();
        sink.done();
        return true;
      },
      [this, st](bool) {
        st->ch->cancel();  // no-op once finished; frees the slot if the client vanished
        open_streams_.fetch_sub(1);
      });
}

void Server::setup_routes() {
  auto& h = *http_;
  h.set_payload_max_length(opts_.max_body_bytes);
  const int threads = opts_.http_threads > 0 ? opts_.http_threads : int(2 * opts_.n_parallel + 4);
  h.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const auto s = sched_->stats();
    json j = {{"status", sched_->accepting() ? "ok" : "shutting_down"}, {"active", s.active}, {"queued", s.queued}};
    if (!sched_->accepting()) res.status = 503;
    res.set_content(dump(j), "application/json");
  });
  auto model_obj = [this] {
    return json{{"id", opts_.model_name}, {"object", "model"}, {"created", int64_t(impl_->started)}, {"owned_by", "perry"}};
  };
  h.Get("/v1/models", [model_obj](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"object", "list"}, {"data", json::array({model_obj()})}}), "application/json");
  });
  h.Get(R"(/v1/models/(.+))", [this, model_obj](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != opts_.model_name)
      return send_error(res, 404, fmt::format("the model '{}' does not exist (this server serves '{}')",
                                              std::string(req.matches[1]), opts_.model_name),
                        "invalid_request_error", "model", "model_not_found");
    res.set_content(dump(model_obj()), "application/json");
  });
  // Content-reader handlers read the body themselves: httplib would otherwise cap bodies sent as
  // application/x-www-form-urlencoded (curl -d) at 8 KiB. The payload limit (413) still applies.
  for (bool chat : {true, false})
    h.Post(chat ? "/v1/chat/completions" : "/v1/completions",
           [this, chat](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& read) {
             std::string body;
             const bool ok = read([&](const char* d, size_t n) {
               body.append(d, n);
               return true;
             });
             if (!ok) {
               if (res.status < 400) send_error(res, 400, "could not read the request body");
               return;
             }
             handle_generate(body, res, chat);
           });

  // Known routes with the wrong method: 405 with Allow.
  auto not_allowed = [](const char* allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      send_error(res, 405, fmt::format("method {} is not allowed on {} (use {})", req.method, req.path, allow));
    };
  };
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    h.Get(path, not_allowed("POST"));
    h.Put(path, not_allowed("POST"));
    h.Delete(path, not_allowed("POST"));
    h.Patch(path, not_allowed("POST"));
  }
  for (const char* path : {"/health", "/v1/models"}) {
    h.Post(path, not_allowed("GET"));
    h.Put(path, not_allowed("GET"));
    h.Delete(path, not_allowed("GET"));
    h.Patch(path, not_allowed("GET"));
  }
  // Whatever httplib rejects itself (unknown route 404, body too large 413, unparsable request
  // 400) gets an OpenAI error body; responses our handlers already filled are left alone.
  h.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    if (res.status == 404) msg = fmt::format("unknown route {} {}", req.method, req.path);
    else if (res.status == 413) msg = "the request body is too large";
    else msg = fmt::format("HTTP error {}", res.status);
    send_error(res, res.status, msg, "invalid_request_error", "", res.status == 404 ? "not_found" : "");
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = fmt::format("internal error: {}", e.what());
    } catch (...) {
    }
    send_error(res, 500, msg, "server_error");
  });
}

Server::~Server() { stop(std::chrono::milliseconds(0)); }

int Server::bind() {
  // A client that disconnects mid-stream must not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  if (opts_.port == 0) port_ = http_->bind_to_any_port(opts_.host);
  else port_ = http_->bind_to_port(opts_.host, opts_.port) ? opts_.port : -1;
  if (port_ <= 0) fail("cannot listen on {}:{} (address in use, or not a local address?)", opts_.host, opts_.port);
  return port_;
}

void Server::run() {
  PERRY_CHECK(port_ > 0, "Server::run: call bind() first");
  if (stopped_) return;
  http_->listen_after_bind();
}

void Server::stop(std::chrono::milliseconds drain) {
  if (stopped_.exchange(true)) return;
  // Running streams finish (or are cancelled at the deadline) before the listener closes, so
  // every client gets a well-formed end of stream.
  const auto t0 = std::chrono::steady_clock::now();
  sched_->drain(drain);
  // A stream's last chunks (finish reason, usage, [DONE]) are written by its HTTP thread after
  // the sequence ends, and httplib stops every content provider once the listener closes: wait
  // for them too (to the drain deadline, plus a short grace for streams cancelled at it).
  const auto until = t0 + drain + std::chrono::seconds(2);
  while (open_streams_.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  sched_->stop();
  http_->stop();
}

}  // namespace perry::server
