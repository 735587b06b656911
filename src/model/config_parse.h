// What the families' config parsers share (internal to the model folder): one error listing every
// problem, the KDA/MLA layer schedule, and each family's entry point. parse_config (config.h)
// routes on `architectures` to one of them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace deltafin {

// "invalid <family> config" with at most 20 problems listed (a config listing a million bad
// layers must not print a million lines).
[[noreturn]] void fail_config(const std::string& path, Family family,
                              const std::vector<std::string>& problems);

// linear_attn_config's 1-based full_attn_layers / kda_layers into c.layer_kinds (num_layers
// set); every layer must be in exactly one list. `prefix` names the object in errors
// ("text_config.linear_attn_config."). With !layers_ok (no valid layer count) nothing is checked.
void parse_layer_schedule(const nlohmann::json& lin, const std::string& prefix, bool layers_ok,
                          ModelConfig& c, std::vector<std::string>& problems);

// KimiLinearForCausalLM (docs/FAMILY.md KL.2); config_kimi_linear.cpp.
ModelConfig parse_kimi_linear_config(const nlohmann::json& root, const std::string& path);

// DeepseekV3ForCausalLM (Kimi K2, K2-Thinking, DeepSeek-V3 / V3.1) and
// KimiK25ForConditionalGeneration (its text_config) (docs/FAMILY.md "DeepSeek-V3 and Kimi K2");
// config_deepseek_v3.cpp.
ModelConfig parse_deepseek_v3_config(const nlohmann::json& root, const std::string& path);
ModelConfig parse_kimi_k25_config(const nlohmann::json& root, const std::string& path);

}  // namespace deltafin
