// Shared helpers for the tokenizer tests: the Hugging Face oracle (tests/oracle/
// tokenize_oracle.js run with node), the llama.cpp vocab test vectors, and the corpus.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace perry::tokenizer::test {

std::string source_dir();          // PERRY_SOURCE_DIR env var, else the compile definition
std::string qwen3_json_path();
std::string llama3_json_path();

struct OracleEncoding {
  std::vector<int32_t> ids, ids_no_special;
  std::string decoded, decoded_skip_special;
  std::string roundtrip;  // HF decode(encode(text, add_special_tokens=false))
};
struct OracleDecoding {
  std::string decoded, decoded_skip_special;
};
struct OracleResult {
  std::vector<OracleEncoding> encodings;
  std::vector<OracleDecoding> decodings;
};
// Runs the HF tokenizers oracle. Throws std::runtime_error (with the hint to run
// scripts/install-deps.sh) when node or the npm packages are missing.
OracleResult run_oracle(const std::string& tokenizer_json_path, const std::vector<std::string>& texts,
                        const std::vector<std::vector<int32_t>>& id_lists = {});

// A fresh directory under the test build dir, removed by the destructor.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The 46-case vectors shipped with llama.cpp (`name` is e.g. "qwen2" or "llama-bpe"), taken from
// the git bundle in node-llama-cpp.
struct VocabVectors {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;  // the .out ids (no special tokens)
};
VocabVectors load_llamacpp_vectors(const std::string& name);

// ≥ 1 MiB of varied text built deterministically (fixed seed + local files), cut into chunks.
const std::string& corpus();
std::vector<std::string> corpus_chunks();

// Independent UTF-8 check (utf8proc_iterate), not the tokenizer's own validator.
bool is_valid_utf8(const std::string& s);

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& data);

}  // namespace perry::tokenizer::test
