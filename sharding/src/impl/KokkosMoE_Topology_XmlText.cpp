/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#include "KokkosMoE_Topology_XmlText.hpp"

#include <cctype>

namespace KokkosMoE::Impl::XmlText {

namespace {

bool hex_run(std::string_view s, std::size_t& k, std::size_t min, std::size_t max, std::uint32_t* value = nullptr) {
  std::size_t n = 0;
  std::uint32_t v = 0;
  while (k < s.size() && n < max && std::isxdigit(static_cast<unsigned char>(s[k]))) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[k])));
    v = v * 16 + static_cast<std::uint32_t>(c <= '9' ? c - '0' : c - 'a' + 10);
    ++k;
    ++n;
  }
  if (value) *value = v;
  return n >= min;
}

bool expect(std::string_view s, std::size_t& k, char c) {
  if (k >= s.size() || s[k] != c) return false;
  ++k;
  return true;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (std::tolower(static_cast<unsigned char>(a[k])) != std::tolower(static_cast<unsigned char>(b[k]))) return false;
  return true;
}

bool is_object_type(std::string_view t) {
  static const char* const kTypes[] = {"Machine", "Package", "Die",     "Core",     "PU",       "NUMANode", "Group",
                                       "Bridge",  "PCIDev",  "OSDev",   "Misc",     "MemCache", "L1Cache",  "L2Cache",
                                       "L3Cache", "L4Cache", "L5Cache", "L1iCache", "L2iCache", "L3iCache"};
  for (const char* k : kTypes)
    if (iequals(t, k)) return true;
  return false;
}

std::optional<std::uint64_t> parse_uint(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// hwloc bitmap syntax: "0x" hex words (1-8 digits) separated by commas, optionally led by the infinite "0xf...f".
bool valid_bitmap(std::string_view s) {
  if (s.substr(0, 7) == "0xf...f") {
    s.remove_prefix(7);
    if (s.empty()) return true;
    if (s[0] != ',') return false;
    s.remove_prefix(1);
  }
  if (s.empty()) return false;
  for (;;) {
    const auto comma = s.find(',');
    const std::string_view word = s.substr(0, comma);
    if (word.size() < 3 || word.size() > 10 || word[0] != '0' || word[1] != 'x') return false;
    for (char c : word.substr(2))
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    if (comma == std::string_view::npos) return true;
    s.remove_prefix(comma + 1);
  }
}

// What hwloc's sscanf("%x:%02x:%02x.%01x") reads and keeps: domain <= 0xffff, bus and device 2 digits, one function.
bool valid_busid(std::string_view s) {
  std::size_t k = 0;
  std::uint32_t domain = 0;
  return hex_run(s, k, 1, 4, &domain) && expect(s, k, ':') && hex_run(s, k, 1, 2) && expect(s, k, ':') &&
         hex_run(s, k, 1, 2) && expect(s, k, '.') && hex_run(s, k, 1, 1) && k == s.size();
}

// hwloc's "%x [%04x:%04x] [%04x:%04x] %02x".
bool valid_pci_type(std::string_view s) {
  std::size_t k = 0;
  return hex_run(s, k, 1, 4) && expect(s, k, ' ') && expect(s, k, '[') && hex_run(s, k, 1, 4) && expect(s, k, ':') &&
         hex_run(s, k, 1, 4) && expect(s, k, ']') && expect(s, k, ' ') && expect(s, k, '[') && hex_run(s, k, 1, 4) &&
         expect(s, k, ':') && hex_run(s, k, 1, 4) && expect(s, k, ']') && expect(s, k, ' ') && hex_run(s, k, 1, 2) &&
         k == s.size();
}

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '-' || c == '.';
}
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool xml_char(std::uint32_t cp) {
  return cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) || (cp >= 0xE000 && cp <= 0xFFFD) ||
         (cp >= 0x10000 && cp <= 0x10FFFF);
}

void append_code_point(std::string& out, std::uint32_t cp) {
  if (!xml_char(cp)) {
    out += '?';
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Valid UTF-8 made of XML characters: every other byte (and every forbidden code point) becomes '?'.
std::string xml_text(const std::string& in) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const std::size_t n = in.size();
  for (std::size_t k = 0; k < n;) {
    const unsigned char c = p[k];
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && k + len <= n;
    for (std::size_t q = 1; ok && q < len; ++q) ok = (p[k + q] & 0xc0) == 0x80;
    std::uint32_t cp = c;
    if (ok && len > 1) {
      cp = c & (0xff >> (len + 1));
      for (std::size_t q = 1; q < len; ++q) cp = (cp << 6) | (p[k + q] & 0x3f);
      const std::uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min[len];
    }
    if (ok && xml_char(cp)) {
      out.append(in, k, len);
      k += len;
    } else {
      out += '?';
      k += ok ? len : 1;
    }
  }
  return out;
}

// The escapes both hwloc importers decode alike.
std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\t':
        out += "&#9;";
        break;
      case '\n':
        out += "&#10;";
        break;
      case '\r':
        out += "&#13;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace KokkosMoE::Impl::XmlText
