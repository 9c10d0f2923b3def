// perry serve: an OpenAI-compatible HTTP server with continuous batching (see src/server).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/common.h"
#include "core/error.h"
#include "server/server.h"

namespace perry::cli {

namespace {
int g_sig_pipe[2] = {-1, -1};
void on_signal(int) {
  const char c = 's';
  [[maybe_unused]] ssize_t n = write(g_sig_pipe[1], &c, 1);
}

struct ServeArgs {
  ModelArgs m;
  server::ServerOptions s;
  double drain_s = 10;
  bool quiet = false;
};
}  // namespace

Command register_serve(CLI::App& root) {
  auto* a = new ServeArgs();
  CLI::App* app = root.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, "
                                               "/v1/models, /health) with continuous batching");
  add_model_flags(app, &a->m, false);
  app->add_option("--host", a->s.host, "Address to listen on (default 127.0.0.1; 0.0.0.0 for all interfaces)");
  app->add_option("--port", a->s.port, "TCP port (default 8080; 0 = any free port)");
  app->add_option("-P,--parallel", a->s.n_parallel, "Sequences decoded together (KV-cache slots, default 4)");
  app->add_option("-c,--ctx", a->s.ctx, "Context per sequence in tokens (default: min(4096, model maximum))");
  app->add_option("--name", a->s.model_name, "Model name reported by /v1/models (default: the directory name)");
  app->add_option("--batch-tokens", a->s.max_batch_tokens, "Most tokens in one forward step (default 512)");
  app->add_option("--prefill-chunk", a->s.prefill_chunk, "Most prompt tokens of one request per step (default 256)");
  app->add_option("--drain-timeout", a->drain_s, "On SIGINT/SIGTERM, seconds to let running requests finish (default 10)");
  app->add_flag("--quiet", a->quiet, "Do not log one line per request");
  return {app, [a]() -> int {
    PERRY_CHECK(a->s.port >= 0 && a->s.port < 65536, "--port must be in 0..65535, got {}", a->s.port);
    PERRY_CHECK(a->s.n_parallel >= 1 && a->s.n_parallel <= 256, "--parallel must be in 1..256, got {}", a->s.n_parallel);
    PERRY_CHECK(a->drain_s >= 0, "--drain-timeout must be >= 0");
    a->s.log_requests = !a->quiet;
    // Signals: libraries start threads before main (OpenBLAS), so masking signals to one thread
    // cannot work; an async-signal-safe handler writes to a pipe that a watcher thread reads.
    PERRY_CHECK(pipe(g_sig_pipe) == 0, "cannot create the signal pipe");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);   // also when the shell started us with SIGINT ignored
    sigaction(SIGTERM, &sa, nullptr);
    std::atomic<server::Server*> srv{nullptr};
    std::thread stopper;
    std::thread sig_thread([&] {
      for (int n = 0;; ++n) {
        char c = 0;
        if (read(g_sig_pipe[0], &c, 1) != 1 || c == 'q') return;
        server::Server* s = srv.load();
        if (!s || n > 0) {
          std::fprintf(stderr, "\n[perry serve] interrupted\n");
          std::_Exit(130);
        }
        std::fprintf(stderr, "\n[perry serve] stopping: finishing running requests (up to %.0f s; again to quit now)\n",
                     a->drain_s);
        stopper = std::thread([s, a] { s->stop(std::chrono::milliseconds(int64_t(a->drain_s * 1000))); });
      }
    });
    auto wake_sig_thread = [&] {
      const char q = 'q';
      if (write(g_sig_pipe[1], &q, 1) != 1) std::_Exit(1);
      sig_thread.join();
      if (stopper.joinable()) stopper.join();
    };
    try {
      if (a->s.model_dir.empty()) a->s.model_dir = a->m.dir.empty() ? default_model_dir() : a->m.dir;
      a->m.dir = a->s.model_dir;
      LoadedModel lm = load_model(a->m, true);
      server::Server server(*lm.model, *lm.tokenizer, a->s);
      const int port = server.bind();
      std::fprintf(stderr, "[perry serve] %s (%s, %s) on http://%s:%d  | %lld slots x %lld tokens | model name \"%s\"\n",
                   lm.source.c_str(), lm.model->config().architecture_name.c_str(),
                   std::string(quant::quant_mode_name(lm.model->mode())).c_str(), a->s.host.c_str(), port,
                   (long long)a->s.n_parallel, (long long)server.scheduler().ctx(), server.model_name().c_str());
      srv = &server;
      server.run();
      srv = nullptr;
      wake_sig_thread();
    } catch (...) {
      srv = nullptr;
      wake_sig_thread();
      throw;
    }
    std::fprintf(stderr, "[perry serve] stopped\n");
    return 0;
  }};
}

}  // namespace perry::cli
