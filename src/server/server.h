// `perry serve`: an OpenAI-compatible HTTP server (cpp-httplib + nlohmann-json) on top of the
// continuous-batching Scheduler. This file maps HTTP and JSON to scheduler requests:
//   GET  /health, GET /v1/models
//   POST /v1/chat/completions  (chat template applied; stream → Server-Sent Events)
//   POST /v1/completions       (raw prompt)
// Errors are OpenAI error objects {"error": {message, type, param, code}}: 400 for bad input,
// 404 unknown route, 405 wrong method, 413 body too large, 503 while shutting down.
// Request semantics: any "model" name is accepted (one model is served); max_tokens (or
// max_completion_tokens) defaults to the rest of the context for chat and to 16 for completions;
// sampling fields default to generation_config.json, else OpenAI's (temperature 1, or 0 when the
// file says do_sample: false); no seed = a random one. Fields that would change the result but are
// not implemented (non-zero frequency/presence penalty, logprobs, tools, logit_bias, n > 1, echo,
// best_of, suffix) and unknown fields are 400s; harmless ones (user, metadata, store) are ignored.
// Extension: "ignore_eos": true (as vLLM) generates past end-of-sequence tokens (benchmarks).
// A streaming client that disconnects cancels its sequence at the next token; a non-streaming
// one is only noticed when the response is written (httplib 0.11 cannot tell earlier).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace perry::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0 = an ephemeral port (see Server::port())
  std::string model_dir;            // for the chat template and generation_config.json
  std::string model_name;           // served name (default: the directory's last component)
  int64_t n_parallel = 4;           // KV-cache slots = sequences batched together
  int64_t ctx = 0;                  // tokens per slot; 0 = min(4096, the model's maximum)
  int64_t prefill_chunk = 256;
  int64_t max_batch_tokens = 512;
  size_t max_body_bytes = 8u << 20;
  int http_threads = 0;             // 0 = 2 * n_parallel + 4
  bool log_requests = true;         // one line per request on stderr
};

class Server {
 public:
  // Loads the chat template and eos ids from opts.model_dir and starts the scheduler thread.
  Server(model::Model& model, const tokenizer::Tokenizer& tok, ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; throws perry::Error if it cannot. Returns the port.
  int bind();
  // Serves until stop(); call bind() first.
  void run();
  // Graceful stop: refuse new requests (503), let running ones finish for up to `drain`, cancel
  // the rest, then close the listener. Safe to call from any thread, more than once.
  void stop(std::chrono::milliseconds drain = std::chrono::milliseconds(10000));

  int port() const { return port_; }
  const std::string& model_name() const { return opts_.model_name; }
  Scheduler& scheduler() { return *sched_; }

 private:
  struct Impl;
  void setup_routes();
  void handle_generate(const std::string& body, httplib::Response& res, bool chat);
  ServerOptions opts_;
  int port_ = 0;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<Impl> impl_;
  // Streaming responses whose HTTP side has not finished (their last chunks may still be
  // unwritten after the scheduler sequence ended): stop() closes the listener only when none is.
  // Declared before http_ so that it outlives httplib's threads, whose releasers decrement it.
  std::atomic<int> open_streams_{0};
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> stopped_{false};
};

}  // namespace perry::server
