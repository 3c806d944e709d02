/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The shared command-line parser (KokkosMoE_Cli.hpp). No Kokkos, no exceptions escape cli_main().

#include "KokkosMoE_Cli.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <new>

namespace KokkosMoE {
namespace Impl {

namespace {

// Length of the valid UTF-8 sequence at s[k] (1-4), or 0 if the bytes there are not valid UTF-8 (overlongs,
// surrogates and code points above U+10FFFF are invalid).
std::size_t utf8_length(std::string_view s, std::size_t k) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(k);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (k + n > s.size()) return 0;
  for (std::size_t i = 1; i < n; ++i) {
    if ((b(k + i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k + i) & 0x3F);
  }
  static const std::uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void append_hex(std::string& out, unsigned char c) {
  static const char* hex = "0123456789abcdef";
  out += "\\x";
  out += hex[c >> 4];
  out += hex[c & 15];
}

// One printable line: control bytes and invalid UTF-8 as \xNN (newlines too, so an error stays on one line).
std::string printable_line(std::string_view s, std::size_t max_chars, bool escape_backslash, bool& truncated) {
  std::string out;
  truncated = false;
  std::size_t shown = 0;
  for (std::size_t k = 0; k < s.size();) {
    if (shown >= max_chars) {
      truncated = true;
      break;
    }
    const unsigned char c = static_cast<unsigned char>(s[k]);
    const std::size_t n = utf8_length(s, k);
    if (n == 1 && c >= 0x20 && c != 0x7f) {
      if (c == '\\' && escape_backslash) out += '\\';
      out += static_cast<char>(c);
    } else if (n > 1) {
      out.append(s.data() + k, n);
    } else {
      append_hex(out, c);
    }
    k += n ? n : 1;
    ++shown;
  }
  return out;
}

std::string fmt_bound(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // the shortest of %g forms that reads back exactly
  for (int digits = 1; digits <= 17; ++digits) {
    char b2[64];
    std::snprintf(b2, sizeof b2, "%.*g", digits, v);
    if (std::strtod(b2, nullptr) == v) return b2;
  }
  return buf;
}

std::string range_text(std::int64_t lo, std::int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string range_text(double lo, double hi, bool lo_open, bool hi_open) {
  return std::string(lo_open ? "(" : "[") + fmt_bound(lo) + ", " + fmt_bound(hi) + (hi_open ? ")" : "]");
}

[[noreturn]] void usage(const std::string& msg) { throw CliUsageError(msg); }

// --kokkos-* flags: canonical key per accepted spelling.
struct KokkosFlag {
  const char* name;
  const char* key;
  bool takes_value;
};
const KokkosFlag kKokkosFlags[] = {
    {"--kokkos-num-threads", "threads", true},
    {"--kokkos-threads", "threads", true},
    {"--kokkos-device-id", "device", true},
    {"--kokkos-device", "device", true},
    {"--kokkos-num-devices", "ndevices", true},
    {"--kokkos-ndevices", "ndevices", true},
    {"--kokkos-disable-warnings", "disable-warnings", false},
    {"--kokkos-tune-internals", "tune-internals", false},
    {"--kokkos-help", "help", false},
    {"--kokkos-print-configuration", "print-configuration", false},
    {"--kokkos-tools-help", "tools-help", false},
    {"--kokkos-tools-libs", "tools-libs", true},
    {"--kokkos-tools-library", "tools-libs", true},
    {"--kokkos-tools-args", "tools-args", true},
};
constexpr const char* kKokkosFlagList =
    "--kokkos-num-threads=N, --kokkos-device-id=N, --kokkos-num-devices=N[,K], --kokkos-disable-warnings, "
    "--kokkos-tune-internals, --kokkos-print-configuration, --kokkos-tools-libs=PATH, --kokkos-tools-args=ARGS, "
    "--kokkos-tools-help, --kokkos-help";

std::string version_text(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

void kokkos_flag(CliKokkosArgs& k, const KokkosFlag& f, const std::string& value, int kokkos_version) {
  const std::string key = f.key;
  const std::string flag = f.name;
  if (key == "threads") {
    k.num_threads = static_cast<int>(cli_parse_integer(flag, value, 1, CliKokkosArgs::kMaxThreads));
  } else if (key == "device") {
    k.device_id = static_cast<int>(cli_parse_integer(flag, value, 0, CliKokkosArgs::kMaxDevices - 1));
  } else if (key == "ndevices") {
    const auto comma = value.find(',');
    k.num_devices = static_cast<int>(
        cli_parse_integer(flag + " (N of N[,K])", value.substr(0, comma), 1, CliKokkosArgs::kMaxDevices));
    if (comma != std::string::npos)
      k.skip_device =
          static_cast<int>(cli_parse_integer(flag + " (K of N,K)", value.substr(comma + 1), 0, *k.num_devices - 1));
  } else if (key == "disable-warnings") {
    k.disable_warnings = true;
  } else if (key == "tune-internals") {
    k.tune_internals = true;
  } else if (key == "help") {
    k.help = true;
  } else if (key == "print-configuration") {
    if (kokkos_version < 30700)
      usage(flag + " needs Kokkos >= 3.7; this program uses Kokkos " + version_text(kokkos_version));
    k.print_configuration = true;
  } else if (key == "tools-help") {
    k.tools_help = true;
  } else if (key == "tools-libs") {
    if (value.empty()) usage(flag + " needs a library path, got ''");
    k.tools_libs = value;
  } else if (key == "tools-args") {
    if (value.empty()) usage(flag + " needs a non-empty argument string, got ''");
    k.tools_args = value;
  }
}

}  // namespace

std::string cli_quote(std::string_view text, std::size_t max_chars) {
  bool truncated = false;
  std::string s = "'" + printable_line(text, max_chars, true, truncated) + "'";
  if (truncated) s += "... (" + std::to_string(text.size()) + " bytes)";
  return s;
}

std::int64_t cli_parse_integer(std::string_view flag, std::string_view text, std::int64_t lo, std::int64_t hi) {
  const auto bad = [&](const char* why) {
    usage(std::string(flag) + " expects an integer in " + range_text(lo, hi) + ", got " + cli_quote(text) + why);
  };
  std::size_t k = 0;
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) k = 1;
  if (k == text.size()) bad("");
  std::uint64_t magnitude = 0;
  const std::uint64_t limit = negative ? std::uint64_t(1) << 63 : (std::uint64_t(1) << 63) - 1;
  for (; k < text.size(); ++k) {
    const char c = text[k];
    if (c < '0' || c > '9') bad("");
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (magnitude > (limit - d) / 10) bad(" (out of range)");
    magnitude = magnitude * 10 + d;
  }
  // Two's complement without signed overflow: -2^63 is representable, its magnitude is not.
  const std::int64_t v = negative ? (magnitude == (std::uint64_t(1) << 63) ? std::numeric_limits<std::int64_t>::min()
                                                                           : -static_cast<std::int64_t>(magnitude))
                                  : static_cast<std::int64_t>(magnitude);
  if (v < lo || v > hi) bad(" (out of range)");
  return v;
}

double cli_parse_number(std::string_view flag, std::string_view text, double lo, double hi, bool lo_open,
                        bool hi_open) {
  const auto bad = [&](const char* why) {
    usage(std::string(flag) + " expects a number in " + range_text(lo, hi, lo_open, hi_open) + ", got " +
          cli_quote(text) + why);
  };
  // Decimal only: [-+] digits [. digits] [e [-+] digits]. strtod would also take "inf", "nan", hex floats and
  // leading white space.
  std::size_t k = 0, digits = 0;
  const auto is_digit = [&](std::size_t i) { return i < text.size() && text[i] >= '0' && text[i] <= '9'; };
  if (k < text.size() && (text[k] == '-' || text[k] == '+')) ++k;
  while (is_digit(k)) ++k, ++digits;
  if (k < text.size() && text[k] == '.') {
    ++k;
    while (is_digit(k)) ++k, ++digits;
  }
  if (digits == 0) bad("");
  if (k < text.size() && (text[k] == 'e' || text[k] == 'E')) {
    ++k;
    if (k < text.size() && (text[k] == '-' || text[k] == '+')) ++k;
    if (!is_digit(k)) bad("");
    while (is_digit(k)) ++k;
  }
  if (k != text.size() || text.size() > 400) bad("");
  const std::string copy(text);
  errno = 0;
  const double v = std::strtod(copy.c_str(), nullptr);
  if (errno == ERANGE && v != 0 && std::isfinite(v) == false) bad(" (out of range)");
  if (errno == ERANGE && std::fabs(v) < 1e-300) {
    // underflow: the text is not zero, but no double (or only a subnormal one) holds it
    bool all_zero = true;
    for (char c : copy) {
      if (c == 'e' || c == 'E') break;
      if (c >= '1' && c <= '9') all_zero = false;
    }
    if (!all_zero) bad(" (too small to represent)");
  }
  if (!std::isfinite(v)) bad(" (out of range)");
  const bool below = lo_open ? !(v > lo) : !(v >= lo);
  const bool above = hi_open ? !(v < hi) : !(v <= hi);
  if (below || above) bad(" (out of range)");
  return v == 0 ? 0.0 : v;  // -0 reads as 0
}

void cli_check_input_file(std::string_view flag, const std::string& path, std::uint64_t max_bytes) {
  const std::string f(flag);
  if (path.empty()) usage(f + " needs a file name, got ''");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) usage(f + ": no such file " + cli_quote(path));
    usage(f + ": cannot access " + cli_quote(path) + ": " + std::strerror(e));
  }
  const std::string q = cli_quote(path);
  if (S_ISDIR(st.st_mode)) usage(f + ": " + q + " is a directory; give a regular file");
  if (S_ISFIFO(st.st_mode)) usage(f + ": " + q + " is a FIFO (named pipe); give a regular file");
  if (S_ISCHR(st.st_mode)) usage(f + ": " + q + " is a character device; give a regular file");
  if (S_ISBLK(st.st_mode)) usage(f + ": " + q + " is a block device; give a regular file");
  if (S_ISSOCK(st.st_mode)) usage(f + ": " + q + " is a socket; give a regular file");
  if (!S_ISREG(st.st_mode)) usage(f + ": " + q + " is not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes)
    usage(f + ": " + q + " has " + std::to_string(st.st_size) + " bytes; input files are limited to " +
          std::to_string(max_bytes >> 20) + " MiB");
  if (::access(path.c_str(), R_OK) != 0) usage(f + ": cannot read " + q + ": " + std::strerror(errno));
}

std::vector<std::string> CliKokkosArgs::argv_for(const std::string& program, int kokkos_version) const {
  const bool renamed = kokkos_version >= 30700;
  std::vector<std::string> a{program};
  if (num_threads)
    a.push_back((renamed ? "--kokkos-num-threads=" : "--kokkos-threads=") + std::to_string(*num_threads));
  if (device_id) a.push_back("--kokkos-device-id=" + std::to_string(*device_id));
  if (num_devices)
    a.push_back("--kokkos-num-devices=" + std::to_string(*num_devices) +
                (skip_device ? "," + std::to_string(*skip_device) : std::string()));
  if (disable_warnings) a.push_back("--kokkos-disable-warnings");
  if (tune_internals) a.push_back("--kokkos-tune-internals");
  if (print_configuration) a.push_back("--kokkos-print-configuration");
  if (tools_libs) a.push_back((renamed ? "--kokkos-tools-libs=" : "--kokkos-tools-library=") + *tools_libs);
  if (tools_args) a.push_back("--kokkos-tools-args=" + *tools_args);
  if (tools_help) a.push_back("--kokkos-tools-help");
  if (help) a.push_back("--kokkos-help");
  return a;
}

CliArgs parse_command_line(int argc, const char* const* argv, const std::vector<CliFlag>& flags, int kokkos_version) {
  CliArgs out;
  std::map<std::string, std::string> kokkos_seen;  // key -> spelling used
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i] ? argv[i] : "";
    if (arg.empty()) usage("unexpected empty argument (this program takes no positional arguments)");
    if (arg.size() < 2 || arg[0] != '-' || arg == "--")
      usage("unexpected argument " + cli_quote(arg) +
            " (this program takes no positional arguments; --help lists the options)");
    std::string name = arg, value;
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      const auto eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        inline_value = true;
      }
    }
    auto take_value = [&](const std::string& flag) {
      if (inline_value) return;
      if (i + 1 >= argc || !argv[i + 1]) usage(flag + " needs a value");
      const std::string next = argv[i + 1];
      if (next.rfind("--", 0) == 0 && next.size() > 2)
        usage(flag + " needs a value, got the option " + cli_quote(next) + " (write " + flag +
              "=VALUE for a value that starts with --)");
      value = next;
      ++i;
    };
    if (name.rfind("--kokkos-", 0) == 0 && kokkos_version != 0) {
      const KokkosFlag* f = nullptr;
      for (const auto& k : kKokkosFlags)
        if (name == k.name) f = &k;
      if (!f) usage("unknown Kokkos option " + cli_quote(name) + " (supported: " + kKokkosFlagList + ")");
      if (auto it = kokkos_seen.find(f->key); it != kokkos_seen.end())
        usage(name + " given twice" + (it->second == name ? std::string() : " (also as " + it->second + ")"));
      kokkos_seen.emplace(f->key, name);
      if (!f->takes_value && inline_value) usage(name + " takes no value, got " + cli_quote(arg));
      if (f->takes_value) take_value(name);
      kokkos_flag(out.m_kokkos, *f, value, kokkos_version);
      continue;
    }
    const CliFlag* f = nullptr;
    for (const auto& c : flags)
      if (name == c.name || (!c.alias.empty() && name == c.alias)) f = &c;
    if (!f) {
      std::string hint = " (--help lists the options)";
      if (name.rfind("--kokkos-", 0) == 0) hint = " (this program does not use Kokkos)";
      usage("unknown option " + cli_quote(name) + hint);
    }
    if (out.m_values.count(f->name)) usage(f->name + " given twice");
    if (!f->takes_value && inline_value) usage(f->name + " takes no value, got " + cli_quote(arg));
    if (f->takes_value) take_value(f->name);
    out.m_values.emplace(f->name, value);
  }
  return out;
}

bool CliArgs::has(std::string_view flag) const { return m_values.find(flag) != m_values.end(); }

const std::string* CliArgs::raw(std::string_view flag) const {
  auto it = m_values.find(flag);
  return it == m_values.end() ? nullptr : &it->second;
}

std::optional<std::int64_t> CliArgs::integer(std::string_view flag, std::int64_t lo, std::int64_t hi) const {
  const std::string* v = raw(flag);
  if (!v) return std::nullopt;
  return cli_parse_integer(flag, *v, lo, hi);
}

std::int64_t CliArgs::integer(std::string_view flag, std::int64_t lo, std::int64_t hi, std::int64_t fallback) const {
  return integer(flag, lo, hi).value_or(fallback);
}

std::optional<double> CliArgs::number(std::string_view flag, double lo, double hi, bool lo_open, bool hi_open) const {
  const std::string* v = raw(flag);
  if (!v) return std::nullopt;
  return cli_parse_number(flag, *v, lo, hi, lo_open, hi_open);
}

double CliArgs::number(std::string_view flag, double lo, double hi, bool lo_open, bool hi_open, double fallback) const {
  return number(flag, lo, hi, lo_open, hi_open).value_or(fallback);
}

std::string CliArgs::choice(std::string_view flag, const std::vector<std::string>& choices,
                            const std::string& fallback) const {
  const std::string* v = raw(flag);
  if (!v) return fallback;
  if (std::find(choices.begin(), choices.end(), *v) != choices.end()) return *v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  usage(std::string(flag) + " expects one of " + list + "; got " + cli_quote(*v));
}

std::string CliArgs::text(std::string_view flag, const std::string& fallback) const {
  const std::string* v = raw(flag);
  if (!v) return fallback;
  if (v->empty()) usage(std::string(flag) + " needs a non-empty value, got ''");
  return *v;
}

std::optional<std::string> CliArgs::input_file(std::string_view flag, std::uint64_t max_bytes) const {
  const std::string* v = raw(flag);
  if (!v) return std::nullopt;
  cli_check_input_file(flag, *v, max_bytes);
  return *v;
}

std::optional<std::string> CliArgs::output_file(std::string_view flag) const {
  const std::string* v = raw(flag);
  if (!v) return std::nullopt;
  const std::string f(flag);
  if (v->empty()) usage(f + " needs a file name ('-' for standard output), got ''");
  if (*v == "-") return *v;
  const std::string q = cli_quote(*v);
  struct stat st;
  if (::stat(v->c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) usage(f + ": " + q + " is a directory; give a file name");
    if (!S_ISREG(st.st_mode)) usage(f + ": " + q + " exists and is not a regular file (a device, FIFO or socket)");
    return *v;
  }
  if (errno != ENOENT) usage(f + ": cannot access " + q + ": " + std::strerror(errno));
  const auto slash = v->find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : v->substr(0, slash));
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    usage(f + ": the directory " + cli_quote(dir) + " of " + q + " does not exist");
  return *v;
}

void cli_check_kokkos_environment(const CliKokkosArgs& args) {
  struct EnvInt {
    const char* name;
    std::int64_t lo, hi;
    std::optional<int> flag_value;
    const char* flag;
  };
  const EnvInt vars[] = {
      {"KOKKOS_NUM_THREADS", 1, CliKokkosArgs::kMaxThreads, args.num_threads, "--kokkos-num-threads"},
      {"KOKKOS_DEVICE_ID", 0, CliKokkosArgs::kMaxDevices - 1, args.device_id, "--kokkos-device-id"},
      {"KOKKOS_NUM_DEVICES", 1, CliKokkosArgs::kMaxDevices, args.num_devices, "--kokkos-num-devices"},
      {"KOKKOS_SKIP_DEVICE", 0, CliKokkosArgs::kMaxDevices - 1, args.skip_device, "--kokkos-num-devices (K)"},
      {"KOKKOS_NUMA", 1, 1024, std::nullopt, ""},
  };
  for (const auto& v : vars) {
    const char* e = std::getenv(v.name);
    if (!e) continue;
    const std::int64_t x = cli_parse_integer(std::string("the environment variable ") + v.name, e, v.lo, v.hi);
    if (v.flag_value && *v.flag_value != x)
      usage(std::string(v.name) + "=" + std::to_string(x) + " disagrees with " + v.flag + "=" +
            std::to_string(*v.flag_value) + " (Kokkos requires them to match; unset one)");
  }
}

int cli_main(const char* program, const std::function<int()>& body) noexcept {
  auto report = [program](const char* what) {
    bool truncated = false;
    const std::string line = printable_line(what ? what : "unknown error", 4096, false, truncated);
    std::fprintf(stderr, "%s: error: %s%s\n", program, line.c_str(), truncated ? " ..." : "");
    std::fflush(stderr);
  };
  int rc = 1;
  try {
    rc = body();
    std::cout.flush();
    if (!std::cout) {
      report("cannot write to standard output");
      return 1;
    }
    return rc;
  } catch (const CliUsageError& e) {
    report(e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    report("out of memory");
    return 1;
  } catch (const std::exception& e) {
    report(e.what());
    return 1;
  } catch (...) {
    report("unknown exception");
    return 1;
  }
}

}  // namespace Impl
}  // namespace KokkosMoE
