// config.json parsing: the fields each family needs, and clear errors for bad configs.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"

using namespace perry;
using namespace perry::io;

TEST(ModelConfig, Qwen3WithHeadDimAndRopeParameters) {
  auto c = parse_model_config(R"({"architectures":["Qwen3ForCausalLM"],"vocab_size":8192,"hidden_size":64,
    "intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,
    "rms_norm_eps":1e-5,"rope_parameters":{"rope_type":"default","rope_theta":20000.0},"tie_word_embeddings":false,
    "max_position_embeddings":512,"dtype":"bfloat16","eos_token_id":[3,4]})", "c");
  EXPECT_EQ(c.arch, Architecture::Qwen3);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.kv_dim(), 64);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_DOUBLE_EQ(c.rope_theta, 20000.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{3, 4}));
}

TEST(ModelConfig, LlamaRopeScalingBothSpellings) {
  for (const char* rope : {R"("rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":256})",
                           R"("rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":256})"}) {
    std::string j = std::string(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":1,"num_attention_heads":4,"rope_theta":500000.0,)") + rope + "}";
    auto c = parse_model_config(j, "c");
    EXPECT_EQ(c.rope_scaling.type, RopeType::Llama3);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 256);
    EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
    EXPECT_EQ(c.num_kv_heads, 4);
    EXPECT_EQ(c.head_dim, 16);
  }
}

TEST(ModelConfig, Qwen2AlwaysHasQkvBias) {
  auto c = parse_model_config(R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":100,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2})", "c");
  EXPECT_TRUE(c.attention_bias);
}

TEST(ModelConfig, ClearErrors) {
  auto err = [](const std::string& j) -> std::string {
    try {
      parse_model_config(j, "cfg.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(err(R"({"architectures":["MistralForCausalLM"]})").find("unsupported architecture"), std::string::npos);
  EXPECT_NE(err(R"({"architectures":["LlamaForCausalLM"]})").find("missing required field"), std::string::npos);
  EXPECT_NE(err(R"({"architectures":["LlamaForCausalLM"],"vocab_size":"big"})").find("must be an integer"), std::string::npos);
  EXPECT_NE(err(R"({"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":64,"intermediate_size":1,
     "num_hidden_layers":1,"num_attention_heads":5,"num_key_value_heads":2})").find("multiple of"), std::string::npos);
  EXPECT_NE(err(R"({"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":64,"intermediate_size":1,
     "num_hidden_layers":1,"num_attention_heads":4,"rope_scaling":{"rope_type":"yarn"}})").find("not supported"), std::string::npos);
  EXPECT_NE(err("{}").find("cfg.json"), std::string::npos);
}

TEST(Checkpoint, MissingDirectoryAndFiles) {
  EXPECT_THROW(Checkpoint::open("/nonexistent/perry/model"), Error);
  try {
    Checkpoint::open("/tmp");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos);
  }
}
