// perry's quantized checkpoint format (what `perry quantize` writes; Model::load reads it back
// without re-quantizing). For each quantized linear X: `X.qweight` (I8 [N,K], or U8 [N,ceil(K/2)]
// packed int4, low nibble = even k, two's complement, or F8_E4M3 [N,K] e4m3fn codes for
// w8a8-fp8) and `X.scales` (F32 [N, groups]); `X.bias`
// stays float. Everything else (embeddings, norms, float linears) is copied unchanged, except
// norms changed by SmoothQuant, which are written in F32. config.json gets
// quantization_config = {quant_method: "perry", format_version: 1, mode, lm_head_quantized,
// modules: {name: mode}} — per-module modes allow mixed precision. Tokenizer files are copied.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace perry::model {

// `model` must have been loaded (and quantized) from the float checkpoint `in_dir`.
void save_quantized_checkpoint(const Model& model, const std::string& in_dir, const std::string& out_dir,
                               const nlohmann::json& extra_quantization_config = nlohmann::json::object());

}  // namespace perry::model
