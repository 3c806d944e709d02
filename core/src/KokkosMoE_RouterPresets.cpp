/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_RouterPresets.hpp>

namespace KokkosMoE {
namespace {

RouterPreset make(const char* name, const char* model, int E, int hidden, bool bias, int k, ScoreFunction f, int groups,
                  int group_topk, float scale) {
  RouterPreset p;
  p.name = name;
  p.model = model;
  p.num_experts = E;
  p.hidden_size = hidden;
  p.has_bias = bias;
  p.config.topk = k;
  p.config.score_function = f;
  p.config.use_pre_softmax = false;
  p.config.num_groups = groups;
  p.config.group_topk = group_topk;
  p.config.scaling_factor = scale;
  return p;
}

std::vector<RouterPreset> all_presets() {
  return {
      make("deepseek-v3", "DeepSeek-V3", 256, 7168, true, 8, ScoreFunction::Sigmoid, 8, 4, 2.5f),
      make("qwen3-moe", "Qwen3-235B-A22B", 128, 4096, false, 8, ScoreFunction::Softmax, 0, 0, 1.0f),
      make("mixtral", "Mixtral 8x7B", 8, 4096, false, 2, ScoreFunction::Softmax, 0, 0, 1.0f),
      make("llama4-scout", "Llama 4 Scout", 16, 5120, false, 1, ScoreFunction::Sigmoid, 0, 0, 1.0f),
      make("llama4-maverick", "Llama 4 Maverick", 128, 5120, false, 1, ScoreFunction::Sigmoid, 0, 0, 1.0f),
      make("large", "stress case", 1024, 4096, false, 32, ScoreFunction::Softmax, 0, 0, 1.0f),
      make("kimi-k2", "Kimi K2", 384, 7168, true, 8, ScoreFunction::Sigmoid, 0, 0, 2.827f),
  };
}

}  // namespace

RouterPreset router_preset(const std::string& name) {
  std::string known;
  for (auto& p : all_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw InvalidArgument("router_preset", "name", Rule::ConfigValue,
                        "unknown preset '" + name + "' (known: " + known + ")");
}

std::vector<std::string> router_preset_names() {
  std::vector<std::string> names;
  for (auto& p : all_presets()) names.push_back(p.name);
  return names;
}

}  // namespace KokkosMoE
