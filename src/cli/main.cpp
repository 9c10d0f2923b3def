// perry — the command-line front end. Parses flags (CLI11), dispatches to a subcommand, turns
// every perry::Error into a clear message and exit code 1.
#include <cstdio>
#include <vector>

#include "cli/common.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace perry::cli;
  CLI::App app{"perry — LLM inference with online int8 activation quantization (W8A8 / W4A8)\n"
               "Loads Hugging Face Llama-3 / Qwen2 / Qwen3 checkpoints; with no -m it uses the embedded\n"
               "model perry-qwen3-20m."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "perry 0.1.0");
  std::vector<Command> cmds = {register_run(app),      register_ppl(app),      register_info(app),
                               register_tokenize(app), register_quantize(app), register_export(app),
                               register_bench(app),    register_bench_op(app), register_serve(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& c : cmds)
      if (c.app->parsed()) return c.run();
  } catch (const perry::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nperry: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "\nperry: error: out of memory (try a smaller --ctx, a quantized mode, or a smaller model)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nperry: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
