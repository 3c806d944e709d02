/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// libFuzzer target over the shared command-line parser. The input is an argv: NUL-separated arguments;
// its first byte picks the Kokkos version the parser validates --kokkos-* flags for (none, 3.4.1, 4.6.0). Every
// typed accessor of every flag is called. Any exception other than CliUsageError, a crash or a sanitizer report is a
// finding, as is an error message that is not one printable line. Seeds: unit_test/sharding/fuzz_corpus/cli.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "KokkosMoE_Cli.hpp"

namespace {

using KokkosMoE::Impl::CliArgs;
using KokkosMoE::Impl::CliFlag;

const std::vector<CliFlag> kFlags = {
    {"--preset", true, ""},  {"--nodes", true, ""}, {"--tokens", true, ""}, {"--xml", true, ""},
    {"--capture", true, ""}, {"--json", false, ""}, {"--gbps", true, ""},   {"--efficiency", true, ""},
    {"--seed", true, ""},    {"--dtype", true, ""}, {"--name", true, ""},   {"--help", false, "-h"},
};

void check_message(const char* what) {
  for (const char* c = what; *c; ++c)
    if (*c == '\n' || *c == '\r') {
      std::fprintf(stderr, "usage error message spans lines: %s\n", what);
      std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const int kVersions[] = {0, 30401, 40600};
  const int version = kVersions[data[0] % 3];
  std::vector<std::string> args{"kokkosmoe-fuzz"};
  std::string cur;
  for (std::size_t k = 1; k < size; ++k) {
    if (data[k] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[k]);
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    const CliArgs c = KokkosMoE::Impl::parse_command_line(static_cast<int>(argv.size()), argv.data(), kFlags, version);
    (void)c.choice("--preset", {"deepseek-v3", "large"}, "deepseek-v3");
    (void)c.integer("--nodes", 1, 65536, 1);
    (void)c.integer("--tokens", 0, INT64_MAX, 0);
    (void)c.integer("--seed", INT64_MIN, INT64_MAX, 0);
    (void)c.number("--gbps", 1e-3, 1e6, false, false, 1);
    (void)c.number("--efficiency", 0, 1, true, false, 1);
    (void)c.text("--name", "");
    (void)c.input_file("--xml", KokkosMoE::Impl::kCliMaxInputBytes);
    (void)c.output_file("--capture");
    (void)c.kokkos().argv_for("kokkosmoe-fuzz", version ? version : 30401);
    KokkosMoE::Impl::cli_check_kokkos_environment(c.kokkos());
  } catch (const KokkosMoE::Impl::CliUsageError& e) {
    check_message(e.what());
  }
  return 0;
}
