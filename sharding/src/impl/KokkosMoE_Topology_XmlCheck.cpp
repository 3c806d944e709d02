/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// A small, allocation-bounded XML scanner: just enough of XML 1.0 for what hwloc writes (prolog, comments,
// DOCTYPE, elements, attributes, text). It never trusts a declared size before checking it against the text.
//
// It also writes the canonical form of the document that hwloc is then given (XmlCheckResult::canonical), so that
// the loader, not the installed hwloc plugins, decides what a file means. hwloc has two XML importers that read
// the same bytes differently: its built-in parser (HWLOC_LIBXML_IMPORT=0, or no libhwloc-plugins) takes any byte,
// ignores comments only before <topology>, stops reading a tag's attributes at the first name with a digit or an
// upper-case letter and decodes no character references beyond &#9; &#10; &#13;; the libxml2 one (Debian's
// libhwloc-plugins) rejects invalid UTF-8 and XML-forbidden characters, normalizes white space in attribute values
// and line ends in text, and decodes every reference. The canonical form is the common subset both read alike:
// the XML declaration and hwloc's DOCTYPE on their own lines, then elements only (no comments, processing
// instructions or userdata), one double-quoted attribute per lower-case name, values as valid UTF-8 with every
// XML-forbidden character replaced by '?' and escaped with &amp; &lt; &gt; &quot; &#9; &#10; &#13; only, array
// texts re-joined with single spaces and their length= recomputed. A forced importer (setenv before
// hwloc_topology_init) would not do: hwloc caches its choice in a static on first use and the environment is the
// process's, not the library's.

#include "KokkosMoE_Topology_XmlCheck.hpp"

#include <KokkosMoE_Error.hpp>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "KokkosMoE_Topology_XmlText.hpp"

namespace KokkosMoE::Impl {

namespace {

using namespace XmlText;

// libxml2 refuses documents nested deeper than 256 elements and values longer than 10 MB; the built-in importer
// has no such limits. Ours are below both, so a file either loads with both importers or with neither.
constexpr std::size_t kMaxDepth = 128;
constexpr std::size_t kMaxValueBytes = 1u << 20;
constexpr std::uint64_t kMaxMatrixObjects = 65536;
constexpr std::uint64_t kMaxOsIndex = 1u << 20;  // PUs / NUMA nodes: far beyond any machine

struct Attr {
  std::string_view name;
  std::string value;  // entities decoded
};

struct ObjectRecord {
  std::string type;
  std::optional<std::uint64_t> os_index;
  int line = 0;
};

struct MatrixRecord {
  XmlDeclaredMatrix decl;
  std::string type;  // distances2 only
  bool os_indexing = false;
  std::vector<std::pair<std::string, std::uint64_t>> indexes;  // (type or "", index)
  std::size_t num_values = 0;
  bool saw_values = false;
};

class Scanner {
 public:
  Scanner(std::string_view xml, const std::string& source) : m_xml(xml), m_source(source) {}

  XmlCheckResult run() {
    m_out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n";
    if (m_xml.size() >= 3 && m_xml.substr(0, 3) == "\xEF\xBB\xBF") m_pos = 3;
    if (m_xml.find('\0') != std::string_view::npos) {
      // hwloc reads the buffer as a C string: anything after a NUL would be ignored. Only a final NUL is fine.
      const auto nul = m_xml.find('\0');
      if (m_xml.find_first_not_of('\0', nul) != std::string_view::npos) fail_at(nul, "document", "contains a NUL byte");
      m_xml = m_xml.substr(0, nul);
    }
    while (m_pos < m_xml.size()) {
      if (m_xml[m_pos] == '<')
        markup();
      else
        text();
    }
    if (!m_stack.empty())
      fail_at(m_xml.size(), "<" + std::string(m_stack.back()) + ">",
              "the document ends before this element is closed (truncated file?)");
    if (!m_saw_root) fail_at(m_xml.size(), "document", "no <topology> element (empty or truncated file?)");
    resolve_matrices();
    XmlCheckResult r;
    r.version = m_version;
    for (const auto& m : m_matrices) r.matrices.push_back(m.decl);
    r.num_objects = m_objects.size();
    r.canonical = std::move(m_out);
    return r;
  }

 private:
  [[noreturn]] void fail_line(int line, const std::string& element, const std::string& what) const {
    throw TopologyError("KokkosMoE topology: " + m_source + ": line " + std::to_string(line) + ": " + element + ": " +
                        what);
  }
  [[noreturn]] void fail_at(std::size_t pos, const std::string& element, const std::string& what) {
    fail_line(line_of(pos), element, what);
  }

  int line_of(std::size_t pos) {
    pos = std::min(pos, m_xml.size());
    if (pos < m_line_pos) {
      m_line_pos = 0;
      m_line = 1;
    }
    m_line += static_cast<int>(std::count(m_xml.begin() + static_cast<std::ptrdiff_t>(m_line_pos),
                                          m_xml.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
    m_line_pos = pos;
    return m_line;
  }

  bool starts_with(std::string_view s) const { return m_xml.substr(m_pos, s.size()) == s; }

  void skip_until(std::string_view terminator, const char* what) {
    const auto end = m_xml.find(terminator, m_pos);
    if (end == std::string_view::npos) fail_at(m_pos, what, "not closed (truncated file?)");
    m_pos = end + terminator.size();
  }

  void markup() {
    if (starts_with("<?")) {
      const std::size_t pi = m_pos;
      skip_until("?>", "<?...?>");
      if (m_xml.substr(pi, 6) == "<?xml ") check_encoding(m_xml.substr(pi, m_pos - pi), pi);
    } else if (starts_with("<!--")) {
      skip_until("-->", "<!-- comment -->");
    } else if (starts_with("<![CDATA[")) {
      fail_at(m_pos, "<![CDATA[", "CDATA sections are not part of hwloc XML");
    } else if (starts_with("<!")) {
      if (m_saw_root) fail_at(m_pos, "<!DOCTYPE>", "markup declaration after the root element");
      const auto bracket = m_xml.find('[', m_pos), close = m_xml.find('>', m_pos);
      if (bracket != std::string_view::npos && (close == std::string_view::npos || bracket < close))
        skip_until("]>", "<!DOCTYPE [...]>");
      else
        skip_until(">", "<!DOCTYPE>");
    } else if (starts_with("</")) {
      end_tag();
    } else {
      start_tag();
    }
  }

  // The XML declaration may name an encoding: anything but UTF-8 (or its ASCII subset) would be transcoded by
  // libxml2 and passed through raw by hwloc's built-in importer.
  void check_encoding(std::string_view decl, std::size_t pos) {
    const auto e = decl.find("encoding");
    if (e == std::string_view::npos) return;
    const auto q = decl.find_first_of("\"'", e);
    if (q == std::string_view::npos) return;
    const auto q2 = decl.find(decl[q], q + 1);
    const std::string_view enc = decl.substr(q + 1, q2 == std::string_view::npos ? 0 : q2 - q - 1);
    if (!iequals(enc, "UTF-8") && !iequals(enc, "UTF8") && !iequals(enc, "US-ASCII") && !iequals(enc, "ASCII"))
      fail_at(pos, "<?xml?>",
              "encoding \"" + std::string(enc) + "\" is not read: hwloc XML is UTF-8 (convert the file with iconv)");
  }

  std::string_view name() {
    const std::size_t b = m_pos;
    if (m_pos >= m_xml.size() || !is_name_start(m_xml[m_pos])) return {};
    while (m_pos < m_xml.size() && is_name_char(m_xml[m_pos])) ++m_pos;
    return m_xml.substr(b, m_pos - b);
  }

  void skip_space() {
    while (m_pos < m_xml.size() && is_space(m_xml[m_pos])) ++m_pos;
  }

  // Attribute value as XML 1.0 defines it: references decoded, literal tab / line feed / carriage return
  // normalized to spaces; then made valid: bytes that are not UTF-8 and code points XML forbids become '?'.
  std::string decode(std::string_view raw, std::size_t at, const std::string& element) {
    std::string out;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] != '&') {
        out += (raw[k] == '\t' || raw[k] == '\n' || raw[k] == '\r') ? ' ' : raw[k];
        continue;
      }
      const auto semi = raw.find(';', k);
      if (semi == std::string_view::npos || semi - k > 10) fail_at(at, element, "unterminated character entity");
      const std::string_view ent = raw.substr(k + 1, semi - k - 1);
      if (ent == "lt")
        out += '<';
      else if (ent == "gt")
        out += '>';
      else if (ent == "amp")
        out += '&';
      else if (ent == "quot")
        out += '"';
      else if (ent == "apos")
        out += '\'';
      else if (ent.size() >= 2 && ent[0] == '#')
        append_code_point(out, numeric_reference(ent.substr(1), at, element));
      else
        fail_at(at, element, "unknown character entity &" + std::string(ent) + ";");
      k = semi;
    }
    return xml_text(out);
  }

  std::uint32_t numeric_reference(std::string_view digits, std::size_t at, const std::string& element) {
    const bool hex = digits[0] == 'x';
    if (hex) digits.remove_prefix(1);
    std::uint32_t cp = 0;
    if (digits.empty() || digits.size() > 8) fail_at(at, element, "malformed character reference");
    for (char c : digits) {
      const int d = std::isdigit(static_cast<unsigned char>(c))           ? c - '0'
                    : hex && std::isxdigit(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10
                                                                          : -1;
      if (d < 0) fail_at(at, element, "malformed character reference");
      cp = cp * (hex ? 16 : 10) + static_cast<std::uint32_t>(d);
    }
    return cp;
  }

  void emit_start(std::string_view tag, const std::vector<Attr>& attrs, bool self_closing, std::size_t pos,
                  const std::string& element) {
    if (m_skip > 0 || tag == "userdata") {  // userdata is hwloc's opaque application data: we never read it
      if (!self_closing) ++m_skip;
      return;
    }
    if (tag == "indexes" || tag == "u64values") return;  // written with its re-joined text when it closes
    if (tag == "topology") {
      for (const auto& a : attrs)
        if (a.name != "version")
          fail_at(pos, element, "attribute " + std::string(a.name) + " is not part of hwloc v2 XML");
      m_out += "<topology version=\"" + get(attrs, "version")->substr() + "\">\n";
      return;
    }
    m_out.append(2 * (m_stack.size() - 1), ' ');
    m_out += '<';
    m_out.append(tag.data(), tag.size());
    for (const auto& a : attrs) {
      // hwloc's built-in importer stops at the first attribute name outside [a-z_] (silently dropping the rest);
      // every attribute hwloc writes is spelled that way.
      if (a.name.empty() || a.name.size() > 64 ||
          !std::all_of(a.name.begin(), a.name.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; }))
        fail_at(pos, element,
                "attribute " + std::string(a.name) + ": hwloc attribute names are lower-case letters and '_'");
      m_out += ' ';
      m_out.append(a.name.data(), a.name.size());
      m_out += "=\"" + escape(a.value) + '"';
    }
    m_out += self_closing ? "/>\n" : ">\n";
  }

  void emit_end(std::string_view tag) {
    if (m_skip > 0) {
      --m_skip;
      return;
    }
    if (tag == "indexes" || tag == "u64values" || tag == "topology") {
      if (tag == "topology") m_out += "</topology>\n";
      return;
    }
    m_out.append(2 * (m_stack.size() - 1), ' ');
    m_out += "</";
    m_out.append(tag.data(), tag.size());
    m_out += ">\n";
  }

  void start_tag() {
    const std::size_t tag_pos = m_pos;
    ++m_pos;
    const std::string_view tag = name();
    if (tag.empty()) fail_at(tag_pos, "document", "'<' not followed by an element name");
    const std::string element = "<" + std::string(tag) + ">";
    std::vector<Attr> attrs;
    bool self_closing = false;
    for (;;) {
      skip_space();
      if (m_pos >= m_xml.size()) fail_at(tag_pos, element, "start tag not closed (truncated file?)");
      if (m_xml[m_pos] == '>') {
        ++m_pos;
        break;
      }
      if (starts_with("/>")) {
        m_pos += 2;
        self_closing = true;
        break;
      }
      const std::size_t attr_pos = m_pos;
      const std::string_view an = name();
      if (an.empty()) fail_at(attr_pos, element, "malformed attribute");
      skip_space();
      if (m_pos >= m_xml.size() || m_xml[m_pos] != '=')
        fail_at(attr_pos, element, "attribute " + std::string(an) + " has no value");
      ++m_pos;
      skip_space();
      if (m_pos >= m_xml.size() || (m_xml[m_pos] != '"' && m_xml[m_pos] != '\''))
        fail_at(attr_pos, element, "attribute " + std::string(an) + " is not quoted");
      const char q = m_xml[m_pos++];
      const auto end = m_xml.find(q, m_pos);
      if (end == std::string_view::npos)
        fail_at(attr_pos, element, "attribute " + std::string(an) + " not closed (truncated file?)");
      const std::string_view raw = m_xml.substr(m_pos, end - m_pos);
      if (raw.size() > kMaxValueBytes)
        fail_at(attr_pos, element,
                "attribute " + std::string(an) + " is longer than " + std::to_string(kMaxValueBytes) + " bytes");
      if (raw.find('<') != std::string_view::npos)
        fail_at(attr_pos, element, "attribute " + std::string(an) + " contains '<'");
      for (const auto& a : attrs)
        if (a.name == an) fail_at(attr_pos, element, "duplicate attribute " + std::string(an));
      attrs.push_back({an, decode(raw, attr_pos, element)});
      m_pos = end + 1;
    }
    open_element(tag, attrs, tag_pos, element);
    emit_start(tag, attrs, self_closing, tag_pos, element);
    if (self_closing) close_element(tag_pos, true);
  }

  void end_tag() {
    const std::size_t tag_pos = m_pos;
    m_pos += 2;
    const std::string_view tag = name();
    skip_space();
    if (tag.empty() || m_pos >= m_xml.size() || m_xml[m_pos] != '>')
      fail_at(tag_pos, "</" + std::string(tag) + ">", "malformed end tag (truncated file?)");
    ++m_pos;
    if (m_stack.empty()) fail_at(tag_pos, "</" + std::string(tag) + ">", "end tag without a start tag");
    if (m_stack.back() != tag)
      fail_at(tag_pos, "</" + std::string(tag) + ">",
              "does not match the open element <" + std::string(m_stack.back()) + ">");
    close_element(tag_pos, false);
  }

  void text() {
    const auto end = m_xml.find('<', m_pos);
    const std::size_t stop = end == std::string_view::npos ? m_xml.size() : end;
    const std::string_view t = m_xml.substr(m_pos, stop - m_pos);
    const bool blank = std::all_of(t.begin(), t.end(), is_space);
    if (m_stack.empty()) {
      if (!blank) fail_at(m_pos, "document", "text outside the root element");
    } else if (m_in_array) {
      if (t.find('&') != std::string_view::npos)
        fail_at(m_pos, m_array_is_index ? "<indexes>" : "<u64values>", "character references are not allowed here");
      if (m_array_text.size() + t.size() > kMaxValueBytes)
        fail_at(m_pos, m_array_is_index ? "<indexes>" : "<u64values>",
                "text longer than " + std::to_string(kMaxValueBytes) + " bytes");
      m_array_text.append(t.data(), t.size());
    } else if (!blank && m_stack.back() != "userdata") {
      fail_at(m_pos, "<" + std::string(m_stack.back()) + ">", "unexpected text");
    }
    m_pos = stop;
  }

  // The hwloc v2 XML grammar (topology-xml.c): which element may appear inside which. hwloc answers anything else
  // with an error, on paths that leak memory in 2.9 (found by the fuzz target), so we refuse it first.
  static bool allowed_child(std::string_view parent, std::string_view tag) {
    if (parent == "topology")
      return tag == "object" || tag == "distances2" || tag == "distances2hetero" || tag == "memattr" ||
             tag == "cpukind" || tag == "support";
    if (parent == "object") return tag == "object" || tag == "page_type" || tag == "info" || tag == "userdata";
    if (parent == "distances2" || parent == "distances2hetero") return tag == "indexes" || tag == "u64values";
    if (parent == "memattr") return tag == "memattr_value";
    if (parent == "cpukind") return tag == "info";
    return false;  // info, page_type, userdata, support, indexes, u64values, memattr_value have no children
  }

  static const std::string* get(const std::vector<Attr>& attrs, std::string_view n) {
    for (const auto& a : attrs)
      if (a.name == n) return &a.value;
    return nullptr;
  }

  void open_element(std::string_view tag, const std::vector<Attr>& attrs, std::size_t pos, const std::string& element) {
    if (m_in_array) fail_at(pos, element, "element inside <indexes>/<u64values>");
    if (m_stack.empty()) {
      if (m_saw_root) fail_at(pos, element, "second root element");
      m_saw_root = true;
      if (tag != "topology") fail_at(pos, element, "the root element must be <topology>");
      const std::string* v = get(attrs, "version");
      if (!v)
        fail_at(pos, element,
                "no version attribute: hwloc v1 XML is not supported (export with `lstopo --of v2xml`, or hwloc "
                "2.x's default)");
      m_version = *v;
      // "2.<minor>": hwloc reads the version with sscanf("%u.%u"); a bare "2" makes its libxml2 importer fall
      // back to the v1 format and its built-in one refuse the file.
      const bool v2 = v->size() >= 3 && v->size() <= 8 && (*v)[0] == '2' && (*v)[1] == '.' &&
                      std::all_of(v->begin() + 2, v->end(), [](char c) { return std::isdigit(c) != 0; });
      if (!v2)
        fail_at(pos, element,
                "unsupported hwloc XML version \"" + *v +
                    "\": only 2.x is read (hwloc 3.x writes 3.0 by default; export with `lstopo --of v2xml`)");
    }
    if (m_stack.size() >= kMaxDepth) fail_at(pos, element, "nesting deeper than " + std::to_string(kMaxDepth));
    if (!m_stack.empty() && !allowed_child(m_stack.back(), tag))
      fail_at(pos, element, "not an hwloc v2 child of <" + std::string(m_stack.back()) + ">");
    if (tag == "object") object(attrs, pos, element);
    if (tag == "distances2" || tag == "distances2hetero") distances(tag, attrs, pos, element);
    if (tag == "indexes" || tag == "u64values") {
      if (m_stack.empty() || (m_stack.back() != "distances2" && m_stack.back() != "distances2hetero"))
        fail_at(pos, element, "outside a <distances2> element");
      const std::string* len = get(attrs, "length");
      if (!len) fail_at(pos, element, "missing length attribute (hwloc requires it)");
      const auto l = parse_uint(*len);
      if (!l) fail_at(pos, element, "length=\"" + *len + "\" is not a number");
      m_in_array = true;
      m_array_is_index = tag == "indexes";
      m_array_length = *l;
      m_array_pos = pos;
      m_array_text.clear();
    }
    m_stack.push_back(tag);
  }

  void close_element(std::size_t pos, bool self_closed) {
    const std::string_view tag = m_stack.back();
    if (!self_closed || tag == "indexes" || tag == "u64values") emit_end(tag);
    if (tag == "indexes" || tag == "u64values") finish_array();
    if ((tag == "distances2" || tag == "distances2hetero") && !m_matrices.empty()) {
      MatrixRecord& m = m_matrices.back();
      const std::string element = "<" + std::string(tag) + " name=\"" + m.decl.name + "\">";
      if (m.indexes.size() != m.decl.nbobjs)
        fail_at(pos, element,
                "nbobjs=\"" + std::to_string(m.decl.nbobjs) + "\" but <indexes> holds " +
                    std::to_string(m.indexes.size()) + " tokens");
      if (m.num_values != m.decl.nbobjs * m.decl.nbobjs)
        fail_at(pos, element,
                "nbobjs=\"" + std::to_string(m.decl.nbobjs) + "\" needs " +
                    std::to_string(m.decl.nbobjs * m.decl.nbobjs) + " values, <u64values> holds " +
                    std::to_string(m.num_values));
    }
    m_stack.pop_back();
  }

  void object(const std::vector<Attr>& attrs, std::size_t pos, const std::string& element) {
    const std::string* type = get(attrs, "type");
    if (!type) fail_at(pos, element, "missing type attribute");
    if (!is_object_type(*type)) fail_at(pos, element, "unknown object type \"" + *type + "\"");
    // Sets: hwloc writes cpuset with complete_cpuset and nodeset with complete_nodeset. hwloc 2.9 dereferences a
    // missing complete_cpuset (segfault, found by the fuzz target), so a half pair is refused here.
    const bool io = iequals(*type, "Bridge") || iequals(*type, "PCIDev") || iequals(*type, "OSDev");
    for (const char* set :
         {"cpuset", "complete_cpuset", "allowed_cpuset", "nodeset", "complete_nodeset", "allowed_nodeset"}) {
      const std::string* v = get(attrs, set);
      if (!v) continue;
      if (io || iequals(*type, "Misc")) fail_at(pos, element, std::string(set) + " on a " + *type + " object");
      if (!valid_bitmap(*v)) fail_at(pos, element, std::string(set) + "=\"" + *v + "\" is not an hwloc bitmap");
    }
    for (auto [a, b] : {std::pair{"cpuset", "complete_cpuset"}, std::pair{"nodeset", "complete_nodeset"}})
      if ((get(attrs, a) != nullptr) != (get(attrs, b) != nullptr))
        fail_at(pos, element, std::string(get(attrs, a) ? a : b) + " without " + (get(attrs, a) ? b : a));
    // PCI objects: hwloc drops an object whose pci_busid its sscanf cannot read (or whose domain exceeds 16 bits in
    // builds without 32-bit domains, Debian's), together with everything below it and the matrix entries naming it;
    // an unreadable pci_type leaves class and vendor 0, so a GPU is no longer recognized. Both vanish without a word
    // from hwloc, so they are errors here.
    if (iequals(*type, "PCIDev") || iequals(*type, "Bridge")) {
      const std::string* busid = get(attrs, "pci_busid");
      const std::string* pcitype = get(attrs, "pci_type");
      const bool needs_busid =
          iequals(*type, "PCIDev") || (get(attrs, "bridge_type") && *get(attrs, "bridge_type") != "0-1");
      if (!busid && needs_busid)
        fail_at(pos, element, "a " + *type + " without pci_busid (hwloc would place it at 0000:00:00.0)");
      if (busid && !valid_busid(*busid))
        fail_at(
            pos, element,
            "pci_busid=\"" + *busid +
                "\" is not a PCI address hwloc reads (dddd:bb:dd.f, domain <= ffff); hwloc would drop this object and "
                "everything below it");
      if (!pcitype && iequals(*type, "PCIDev"))
        fail_at(pos, element, "a PCIDev without pci_type (class, vendor and device unknown)");
      if (pcitype && !valid_pci_type(*pcitype))
        fail_at(pos, element,
                "pci_type=\"" + *pcitype +
                    "\" is not \"cccc [vvvv:dddd] [vvvv:dddd] rr\"; hwloc would leave its class and vendor unknown");
    }
    // hwloc v2 knows host (0) and PCI (1) upstream sides and PCI (1) downstream sides only.
    if (const std::string* bt = get(attrs, "bridge_type"))
      if (*bt != "0-1" && *bt != "1-1") fail_at(pos, element, "bridge_type=\"" + *bt + "\" is not 0-1 or 1-1");
    ObjectRecord rec;
    rec.type = *type;
    rec.line = line_of(pos);
    if (const std::string* os = get(attrs, "os_index")) {
      rec.os_index = parse_uint(*os);
      if (!rec.os_index) fail_at(pos, element, "os_index=\"" + *os + "\" is not a number");
    }
    // PUs and NUMA nodes are bitmap indexes: hwloc writes their os_index always, and a missing one becomes
    // 0xffffffff, which hwloc 2.9 then sets in a bitmap (seconds of work and 512 MB; found by the fuzz target).
    if (iequals(*type, "PU") || iequals(*type, "NUMANode")) {
      if (!rec.os_index) fail_at(pos, element, "a " + *type + " needs an os_index");
      if (*rec.os_index > kMaxOsIndex)
        fail_at(pos, element, "os_index " + std::to_string(*rec.os_index) + " is implausibly large");
    }
    if (const std::string* gp = get(attrs, "gp_index")) {
      const auto g = parse_uint(*gp);
      if (!g || *g == 0) fail_at(pos, element, "gp_index=\"" + *gp + "\" is not a positive number");
      auto [it, inserted] = m_objects.emplace(*g, rec);
      if (!inserted)
        fail_at(pos, element, "gp_index " + *gp + " already used on line " + std::to_string(it->second.line));
    }
    m_all_objects.push_back(rec);
  }

  void distances(std::string_view tag, const std::vector<Attr>& attrs, std::size_t pos, const std::string& element) {
    if (m_stack.size() != 1) fail_at(pos, element, "must be a child of <topology>");
    MatrixRecord m;
    m.decl.line = line_of(pos);
    m.decl.hetero = tag == "distances2hetero";
    if (const std::string* nm = get(attrs, "name")) m.decl.name = *nm;
    const std::string* nb = get(attrs, "nbobjs");
    if (!nb) fail_at(pos, element, "missing nbobjs attribute");
    const auto n = parse_uint(*nb);
    if (!n || *n == 0 || *n > kMaxMatrixObjects)
      fail_at(pos, element, "nbobjs=\"" + *nb + "\" must be in [1, " + std::to_string(kMaxMatrixObjects) + "]");
    m.decl.nbobjs = static_cast<std::size_t>(*n);
    const std::string* kind = get(attrs, "kind");
    if (!kind || !parse_uint(*kind)) fail_at(pos, element, "missing or non-numeric kind attribute");
    if (!m.decl.hetero) {
      const std::string* type = get(attrs, "type");
      if (!type || !is_object_type(*type)) fail_at(pos, element, "missing or unknown type attribute");
      m.type = *type;
      const std::string* indexing = get(attrs, "indexing");
      if (indexing && *indexing != "os" && *indexing != "gp")
        fail_at(pos, element, "indexing=\"" + *indexing + "\" must be \"os\" or \"gp\"");
      // hwloc's default: OS indexes for NUMA nodes and PUs, gp indexes for everything else.
      m.os_indexing = indexing ? *indexing == "os" : (iequals(m.type, "NUMANode") || iequals(m.type, "PU"));
    }
    m_matrices.push_back(std::move(m));
  }

  void finish_array() {
    m_in_array = false;
    MatrixRecord& m = m_matrices.back();
    const std::string element = m_array_is_index ? "<indexes>" : "<u64values>";
    if (m_array_text.size() != m_array_length)
      fail_at(m_array_pos, element,
              "length=\"" + std::to_string(m_array_length) + "\" but the text has " +
                  std::to_string(m_array_text.size()) +
                  " characters (hwloc requires the exact count, trailing space included)");
    std::size_t k = 0;
    const std::string& s = m_array_text;
    std::string joined;
    while (k < s.size()) {
      while (k < s.size() && is_space(s[k])) ++k;
      const std::size_t b = k;
      while (k < s.size() && !is_space(s[k])) ++k;
      if (b == k) break;
      const std::string_view tok(s.data() + b, k - b);
      joined.append(tok.data(), tok.size());
      joined += ' ';
      if (m_array_is_index) {
        if (m.indexes.size() >= m.decl.nbobjs)
          fail_at(m_array_pos, element, "more index tokens than nbobjs=" + std::to_string(m.decl.nbobjs));
        std::string type;
        std::string_view num = tok;
        if (m.decl.hetero) {
          const auto colon = tok.find(':');
          if (colon == std::string_view::npos || !is_object_type(tok.substr(0, colon)))
            fail_at(m_array_pos, element, "index token \"" + std::string(tok) + "\" is not Type:gp_index");
          type = std::string(tok.substr(0, colon));
          num = tok.substr(colon + 1);
        }
        const auto v = parse_uint(num);
        if (!v) fail_at(m_array_pos, element, "index token \"" + std::string(tok) + "\" is not a number");
        m.indexes.emplace_back(type, *v);
      } else {
        if (!parse_uint(tok))
          fail_at(m_array_pos, element, "value \"" + std::string(tok) + "\" is not an unsigned 64-bit integer");
        if (m.num_values >= m.decl.nbobjs * m.decl.nbobjs)
          fail_at(m_array_pos, element,
                  "more values than nbobjs*nbobjs = " + std::to_string(m.decl.nbobjs * m.decl.nbobjs));
        ++m.num_values;
      }
    }
    const char* tag = m_array_is_index ? "indexes" : "u64values";
    m_out.append(2 * (m_stack.size() - 1), ' ');
    m_out +=
        std::string("<") + tag + " length=\"" + std::to_string(joined.size()) + "\">" + joined + "</" + tag + ">\n";
  }

  // Every index must name an object of the declared type; hwloc would silently drop the whole matrix otherwise.
  void resolve_matrices() {
    for (const auto& m : m_matrices) {
      const std::string element =
          std::string(m.decl.hetero ? "<distances2hetero" : "<distances2") + " name=\"" + m.decl.name + "\">";
      std::set<std::pair<std::string, std::uint64_t>> seen;
      for (const auto& [tok_type, index] : m.indexes) {
        const std::string type = m.decl.hetero ? tok_type : m.type;
        const std::string token = (m.decl.hetero ? tok_type + ":" : std::string()) + std::to_string(index);
        bool found = false;
        if (m.os_indexing) {
          for (const auto& o : m_all_objects)
            if (iequals(o.type, type) && o.os_index && *o.os_index == index) found = true;
        } else {
          auto it = m_objects.find(index);
          found = it != m_objects.end() && iequals(it->second.type, type);
          if (it != m_objects.end() && !found)
            fail_line(m.decl.line, element,
                      "index " + token + " names a " + it->second.type + " object, not a " + type);
        }
        if (!found)
          fail_line(m.decl.line, element,
                    "index " + token + " names no " + type + " object" + (m.os_indexing ? " (os indexing)" : "") +
                        " of this topology");
        std::string lowered;
        for (char c : type) lowered += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (!seen.emplace(lowered, index).second) fail_line(m.decl.line, element, "index " + token + " appears twice");
      }
    }
  }

  std::string_view m_xml;
  const std::string& m_source;
  std::size_t m_pos = 0;
  std::size_t m_line_pos = 0;
  int m_line = 1;
  std::vector<std::string_view> m_stack;
  bool m_saw_root = false;
  std::string m_version;
  std::map<std::uint64_t, ObjectRecord> m_objects;  // by gp_index
  std::vector<ObjectRecord> m_all_objects;
  std::vector<MatrixRecord> m_matrices;
  bool m_in_array = false;
  bool m_array_is_index = false;
  std::uint64_t m_array_length = 0;
  std::size_t m_array_pos = 0;
  std::string m_array_text;
  std::string m_out;  // the canonical document
  int m_skip = 0;     // depth inside elements left out of it (userdata)
};

}  // namespace

XmlCheckResult check_hwloc_xml(std::string_view xml, const std::string& source) { return Scanner(xml, source).run(); }

}  // namespace KokkosMoE::Impl
