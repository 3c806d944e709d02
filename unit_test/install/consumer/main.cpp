// A downstream project: routes 3 tokens over 4 experts through the installed package.
#include <KokkosMoE_Config.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_Version.hpp>

#include <cstdio>
#include <cstring>

static_assert(KOKKOSMOE_VERSION ==
                  KOKKOSMOE_VERSION_MAJOR * 10000 + KOKKOSMOE_VERSION_MINOR * 100 + KOKKOSMOE_VERSION_PATCH,
              "the installed KokkosMoE_Version.hpp is consistent");

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight>;
  Matrix logits("logits", 3, 4), probs("probs", 3, 4), inter("intermediate", 3, 4);
  Kokkos::View<std::uint8_t**, Kokkos::LayoutRight> map("map", 3, 4);
  auto h = Kokkos::create_mirror_view(logits);
  for (int t = 0; t < 3; ++t)
    for (int e = 0; e < 4; ++e) h(t, e) = static_cast<float>((e + t) % 4);  // token t prefers expert 3 - t
  Kokkos::deep_copy(logits, h);
  KokkosMoE::RouterConfig config;
  config.topk = 1;
  KokkosMoE::topk_router(config, logits, probs, map, inter);  // on Kokkos::DefaultExecutionSpace
  auto hm = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, map);
  bool ok = KokkosMoE::router_preset("deepseek-v3").num_experts == 256 && std::strlen(KOKKOSMOE_VERSION_STRING) > 0;
  for (int t = 0; t < 3; ++t) ok = ok && hm(t, 3 - t) == 1;
  std::printf("consumer: %s\n", ok ? "OK" : "WRONG ROUTING");
  return ok ? 0 : 1;
}
