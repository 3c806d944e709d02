/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERPRESETS_HPP
#define KOKKOSMOE_ROUTERPRESETS_HPP

/// \file KokkosMoE_RouterPresets.hpp
/// \brief Named router configurations of published MoE models (docs/router.md §15). Names use hyphens.

#include <KokkosMoE_RouterConfig.hpp>

#include <string>
#include <vector>

namespace KokkosMoE {

/// \brief A named model's router: the RouterConfig plus the layer facts that go with it.
struct RouterPreset {
  std::string name;       ///< e.g. "deepseek-v3"
  std::string model;      ///< human-readable model name
  int num_experts = 0;    ///< E
  int hidden_size = 0;    ///< model hidden size (token bytes for EP planning)
  bool has_bias = false;  ///< an FP32 [E] expert bias (score correction) is part of the router
  RouterConfig config;    ///< topk, score function, grouping, scaling
};

/// \brief The preset called \p name ("deepseek-v3", "qwen3-moe", "mixtral", "llama4-scout", "llama4-maverick",
/// "large"). \throws KokkosMoE::InvalidArgument (rule config_value) naming the known presets otherwise.
RouterPreset router_preset(const std::string& name);

/// \brief Every preset name, in the order of docs/router.md §15.
std::vector<std::string> router_preset_names();

}  // namespace KokkosMoE

#endif
