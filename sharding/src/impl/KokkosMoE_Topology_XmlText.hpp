/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TOPOLOGY_XMLTEXT_HPP
#define KOKKOSMOE_TOPOLOGY_XMLTEXT_HPP

// The value level of the hwloc XML check (KokkosMoE_Topology_XmlCheck.cpp): names, numbers, bitmaps and PCI ids as
// hwloc reads them, and text as both hwloc XML importers read alike (valid UTF-8 of XML characters, the escapes
// they decode the same way).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace KokkosMoE::Impl::XmlText {

/// ASCII case-insensitive equality.
bool iequals(std::string_view a, std::string_view b);
/// One of hwloc's object type names (case-insensitive, as hwloc compares them).
bool is_object_type(std::string_view t);
/// A decimal unsigned 64-bit value, nothing else; nullopt on overflow or any other character.
std::optional<std::uint64_t> parse_uint(std::string_view s);
/// hwloc bitmap syntax: "0x" hex words (1-8 digits) separated by commas, optionally led by the infinite "0xf...f".
bool valid_bitmap(std::string_view s);
/// What hwloc's sscanf("%x:%02x:%02x.%01x") reads and keeps: domain <= 0xffff, bus and device 2 digits, one function.
bool valid_busid(std::string_view s);
/// hwloc's "%x [%04x:%04x] [%04x:%04x] %02x".
bool valid_pci_type(std::string_view s);
bool is_name_start(char c);
bool is_name_char(char c);
bool is_space(char c);
/// A code point XML 1.0 allows.
bool xml_char(std::uint32_t cp);
/// cp as UTF-8, or '?' where XML forbids it.
void append_code_point(std::string& out, std::uint32_t cp);
/// Valid UTF-8 made of XML characters: every other byte (and every forbidden code point) becomes '?'.
std::string xml_text(const std::string& in);
/// The escapes both hwloc importers decode alike.
std::string escape(const std::string& v);

}  // namespace KokkosMoE::Impl::XmlText

#endif
