// perry tokenize: ids and pieces of a text under the model's tokenizer.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace perry::cli {

namespace {
struct TokArgs {
  std::string dir, text, file;
  bool no_special = false, ids_only = false;
};
}  // namespace

Command register_tokenize(CLI::App& root) {
  auto* a = new TokArgs();
  CLI::App* app = root.add_subcommand("tokenize", "Show the token ids and pieces of a text");
  app->add_option("-m,--model", a->dir, "Checkpoint directory with tokenizer.json (default: the embedded model)");
  app->add_option("text", a->text, "Text to tokenize");
  app->add_option("-f,--file", a->file, "Read the text from a file");
  app->add_flag("--no-special", a->no_special, "Do not add special tokens (BOS) from the post-processor");
  app->add_flag("--ids", a->ids_only, "Print only the ids, space separated");
  return {app, [a]() -> int {
    std::string text = a->file.empty() ? a->text : read_text_file(a->file);
    std::string dir = a->dir.empty() ? default_model_dir() : a->dir;
    auto tok = tokenizer::Tokenizer::from_file(dir + "/tokenizer.json");
    auto ids = tok.encode(text, !a->no_special);
    if (a->ids_only) {
      for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
      std::printf("\n");
      return 0;
    }
    for (int32_t id : ids) {
      std::string piece = tok.decode({id}, false);
      std::string shown;
      for (unsigned char ch : piece) {
        if (ch == '\n') shown += "\\n";
        else if (ch == '\t') shown += "\\t";
        else shown += char(ch);
      }
      std::printf("%8d  %-20s  '%s'\n", id, tok.token_text(id).c_str(), shown.c_str());
    }
    std::printf("%zu tokens\n", ids.size());
    return 0;
  }};
}

}  // namespace perry::cli
