/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_CLI_HPP
#define KOKKOSMOE_CLI_HPP

// The command-line parser shared by every KokkosMoE program (kokkosmoe-route, kokkosmoe-topo, kokkosmoe-plan, and
// the EP executable when it exists). Internal: not installed, not API (namespace KokkosMoE::Impl).
//
// Rules (docs/hostile-input.md):
//  * every flag is declared; anything else (unknown flags, positional arguments, a flag given twice, a value for a
//    switch, a missing value) is a usage error;
//  * integers are parsed strictly (optional '-', decimal digits, nothing else) into 64 bits with overflow
//    detection, and range-checked before any narrowing; numbers are decimal (no hex, no inf/nan), finite and in a
//    stated range;
//  * the --kokkos-* flags are validated here and handed to Kokkos in the spelling the linked Kokkos understands;
//    Kokkos never sees the user's argv;
//  * input files must be regular files under a size cap (devices, FIFOs, directories are refused before opening);
//  * errors are one line: "<program>: error: <flag> expects ..., got '<value>'", with unprintable bytes escaped and
//    long values shortened; usage errors exit with 2 (cli_main()), other errors with 1, nothing terminates.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace KokkosMoE {
namespace Impl {

/// A command-line usage error (exit status 2).
class CliUsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One declared flag. Values are given as "--name value" or "--name=value".
struct CliFlag {
  std::string name;          ///< "--nodes"
  bool takes_value = false;  ///< false: a switch ("--json")
  std::string alias;         ///< optional second spelling ("-h")
};

/// Validated Kokkos settings (from --kokkos-* flags).
struct CliKokkosArgs {
  std::optional<int> num_threads;         ///< --kokkos-num-threads / --kokkos-threads, in [1, kMaxThreads]
  std::optional<int> device_id;           ///< --kokkos-device-id / --kokkos-device, in [0, kMaxDevices)
  std::optional<int> num_devices;         ///< --kokkos-num-devices / --kokkos-ndevices N[,K], N in [1, kMaxDevices]
  std::optional<int> skip_device;         ///< the K of N,K, in [0, N)
  bool disable_warnings = false;          ///< --kokkos-disable-warnings
  bool tune_internals = false;            ///< --kokkos-tune-internals
  bool help = false;                      ///< --kokkos-help
  bool print_configuration = false;       ///< --kokkos-print-configuration (Kokkos >= 3.7)
  bool tools_help = false;                ///< --kokkos-tools-help
  std::optional<std::string> tools_libs;  ///< --kokkos-tools-libs / --kokkos-tools-library
  std::optional<std::string> tools_args;  ///< --kokkos-tools-args

  static constexpr int kMaxThreads = 1024;
  static constexpr int kMaxDevices = 1024;

  /// The argv (program name first) for Kokkos::initialize, in the spelling of Kokkos \p kokkos_version
  /// (KOKKOS_VERSION, e.g. 30401): 3.7 renamed --kokkos-threads to --kokkos-num-threads and
  /// --kokkos-tools-library to --kokkos-tools-libs.
  std::vector<std::string> argv_for(const std::string& program, int kokkos_version) const;
};

/// The parsed command line: raw values by flag name, plus typed, validating accessors.
class CliArgs {
 public:
  bool has(std::string_view flag) const;
  /// The raw value, or nullptr when the flag is absent (or a switch).
  const std::string* raw(std::string_view flag) const;

  /// Integer in [lo, hi] or \p fallback when absent. \throws CliUsageError naming the flag and the range
  std::int64_t integer(std::string_view flag, std::int64_t lo, std::int64_t hi, std::int64_t fallback) const;
  std::optional<std::int64_t> integer(std::string_view flag, std::int64_t lo, std::int64_t hi) const;
  /// Finite decimal number in the range (open or closed ends) or \p fallback.
  double number(std::string_view flag, double lo, double hi, bool lo_open, bool hi_open, double fallback) const;
  std::optional<double> number(std::string_view flag, double lo, double hi, bool lo_open, bool hi_open) const;
  /// One of \p choices, or \p fallback when absent.
  std::string choice(std::string_view flag, const std::vector<std::string>& choices, const std::string& fallback) const;
  /// A non-empty string value (any bytes), or \p fallback when absent.
  std::string text(std::string_view flag, const std::string& fallback) const;
  /// A readable regular file of at most \p max_bytes (checked with stat before anything opens it).
  std::optional<std::string> input_file(std::string_view flag, std::uint64_t max_bytes) const;
  /// A file to write: "-" (stdout), a new file in an existing directory, or an existing regular file.
  std::optional<std::string> output_file(std::string_view flag) const;

  const CliKokkosArgs& kokkos() const { return m_kokkos; }

 private:
  friend CliArgs parse_command_line(int, const char* const*, const std::vector<CliFlag>&, int);
  std::map<std::string, std::string, std::less<>> m_values;  // switches map to ""
  CliKokkosArgs m_kokkos;
};

/// Parses argv[1..argc). \p kokkos_version: 0 = the program does not use Kokkos (every --kokkos-* flag is an
/// unknown flag); otherwise KOKKOS_VERSION of the linked Kokkos (flags it lacks are refused).
/// \throws CliUsageError on the first problem
CliArgs parse_command_line(int argc, const char* const* argv, const std::vector<CliFlag>& flags,
                           int kokkos_version = 0);

/// \p text quoted for an error message: bytes that are not printable UTF-8 as \xNN, at most \p max_chars shown
/// (then "... (N bytes)").
std::string cli_quote(std::string_view text, std::size_t max_chars = 64);

/// Strict parsers behind CliArgs (exposed for tests and the fuzz target). \throws CliUsageError
std::int64_t cli_parse_integer(std::string_view flag, std::string_view text, std::int64_t lo, std::int64_t hi);
double cli_parse_number(std::string_view flag, std::string_view text, double lo, double hi, bool lo_open, bool hi_open);
/// Refuses anything but a readable regular file of at most \p max_bytes. \throws CliUsageError
void cli_check_input_file(std::string_view flag, const std::string& path, std::uint64_t max_bytes);

/// Checks the Kokkos environment variables the linked Kokkos reads at initialization (KOKKOS_NUM_THREADS,
/// KOKKOS_DEVICE_ID, KOKKOS_NUM_DEVICES, KOKKOS_SKIP_DEVICE): Kokkos 3.4 aborts or throws from inside
/// initialize() on bad values. \throws CliUsageError naming the variable
void cli_check_kokkos_environment(const CliKokkosArgs& args);

/// Runs \p body and turns every exception into one line on stderr: CliUsageError exits 2, anything else 1.
/// Standard output is flushed and checked (a failed write is an error, exit 1).
int cli_main(const char* program, const std::function<int()>& body) noexcept;

/// The most bytes an input file (an hwloc XML fixture, a plan) may have.
inline constexpr std::uint64_t kCliMaxInputBytes = 64ull << 20;

}  // namespace Impl
}  // namespace KokkosMoE

#endif
