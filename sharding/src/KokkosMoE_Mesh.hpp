/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_MESH_HPP
#define KOKKOSMOE_MESH_HPP

/// \file KokkosMoE_Mesh.hpp
/// \brief Value types of the sharding vocabulary: a device mesh with named axes and a per-dimension sharding
/// spec (docs/planner.md §5, docs/router.md §13). Plain C++ (no Kokkos): the planner and the partition rules share it.

#include <KokkosMoE_Error.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace KokkosMoE {

/// \brief What a mesh axis parallelizes. Only `Tensor` changes the router's rules: tensor-parallel ranks hold the
/// same tokens, so the token axis is never split over a Tensor axis (it is replicated along it).
enum class AxisKind : int {
  Data = 0,      ///< data parallel ("dp")
  Expert = 1,    ///< expert parallel ("ep"): tokens are split, experts are placed
  Fsdp = 2,      ///< fully sharded data parallel ("fsdp"): tokens are split like dp
  Tensor = 3,    ///< tensor parallel ("tp"): tokens are replicated
  Pipeline = 4,  ///< pipeline stage ("pp")
  Sequence = 5,  ///< sequence/context parallel ("sp", "cp"): tokens are split
};

/// \brief "data", "expert", "fsdp", "tensor", "pipeline", "sequence".
inline const char* to_string(AxisKind k) noexcept {
  switch (k) {
    case AxisKind::Data:
      return "data";
    case AxisKind::Expert:
      return "expert";
    case AxisKind::Fsdp:
      return "fsdp";
    case AxisKind::Tensor:
      return "tensor";
    case AxisKind::Pipeline:
      return "pipeline";
    case AxisKind::Sequence:
      return "sequence";
  }
  return "unknown";
}

/// \brief Inverse of to_string(AxisKind).
inline std::optional<AxisKind> axis_kind_from_string(std::string_view s) {
  for (int i = 0; i <= 5; ++i)
    if (s == to_string(static_cast<AxisKind>(i))) return static_cast<AxisKind>(i);
  return std::nullopt;
}

/// \brief The conventional kind of an axis name: dp, ep, fsdp, tp, pp, sp/cp; anything else is Data.
inline AxisKind default_axis_kind(std::string_view name) {
  if (name == "ep") return AxisKind::Expert;
  if (name == "fsdp") return AxisKind::Fsdp;
  if (name == "tp") return AxisKind::Tensor;
  if (name == "pp") return AxisKind::Pipeline;
  if (name == "sp" || name == "cp") return AxisKind::Sequence;
  return AxisKind::Data;
}

/// \brief One named mesh axis.
struct MeshAxis {
  std::string name;
  int size = 1;
  AxisKind kind = AxisKind::Data;
  bool operator==(const MeshAxis& o) const { return name == o.name && size == o.size && kind == o.kind; }
  bool operator!=(const MeshAxis& o) const { return !(*this == o); }
};

/// \brief A logical device mesh: named axes, devices numbered row-major (the last axis varies fastest).
class Mesh {
 public:
  Mesh() = default;
  /// \throws KokkosMoE::InvalidArgument (Rule::ConfigValue) for an empty or repeated name, a size < 1, or more
  /// than 2^31 - 1 devices in all
  explicit Mesh(std::vector<MeshAxis> axes) : m_axes(std::move(axes)) {
    long long devices = 1;  // the product is checked in 64 bits, so num_devices() never overflows
    for (std::size_t i = 0; i < m_axes.size(); ++i) {
      const MeshAxis& a = m_axes[i];
      if (a.name.empty()) throw InvalidArgument("Mesh", "axes", Rule::ConfigValue, "a mesh axis needs a name");
      if (a.size < 1)
        throw InvalidArgument("Mesh", "axes", Rule::ConfigValue,
                              "mesh axis '" + a.name + "' has size " + std::to_string(a.size) + "; sizes are >= 1");
      for (std::size_t j = 0; j < i; ++j)
        if (m_axes[j].name == a.name)
          throw InvalidArgument("Mesh", "axes", Rule::ConfigValue, "mesh axis '" + a.name + "' appears twice");
      devices *= a.size;
      if (devices > 2147483647LL)
        throw InvalidArgument(
            "Mesh", "axes", Rule::ConfigValue,
            "the mesh has more than 2^31 - 1 devices (axis '" + a.name + "' of size " + std::to_string(a.size) + ")");
    }
  }

  /// \brief Parses "dp2xep2", "dp2 x fsdp2 x tp2" or "dp=2,ep=2"; kinds from default_axis_kind().
  /// \throws KokkosMoE::InvalidArgument (Rule::ConfigValue) naming the malformed part
  static Mesh parse(std::string_view text) {
    std::vector<MeshAxis> axes;
    std::string part;
    auto flush = [&]() {
      std::string p;
      for (char c : part)
        if (c != ' ' && c != '=') p += c;
      part.clear();
      if (p.empty()) return;
      std::size_t d = p.find_first_of("0123456789");
      if (d == 0 || d == std::string::npos || p.find_first_not_of("0123456789", d) != std::string::npos)
        throw InvalidArgument("Mesh::parse", "text", Rule::ConfigValue,
                              "mesh part '" + p + "' is not <name><size> (e.g. dp2) or <name>=<size>");
      std::string name = p.substr(0, d);
      long long size = 0;  // std::stoi would throw std::out_of_range past 2^31
      for (char c : p.substr(d)) {
        size = size * 10 + (c - '0');
        if (size > 2147483647LL)
          throw InvalidArgument("Mesh::parse", "text", Rule::ConfigValue, "mesh part '" + p + "': size too large");
      }
      axes.push_back({name, static_cast<int>(size), default_axis_kind(name)});
    };
    for (char c : text) {
      if (c == 'x' || c == ',' || c == '*') {
        // 'x' separates axes unless it is part of a name (axis names do not end in digits, sizes do)
        if (c == 'x' && (part.empty() || !std::isdigit(static_cast<unsigned char>(part.back())))) {
          part += c;
          continue;
        }
        flush();
      } else {
        part += c;
      }
    }
    flush();
    return Mesh(std::move(axes));
  }

  const std::vector<MeshAxis>& axes() const { return m_axes; }
  int rank() const { return static_cast<int>(m_axes.size()); }
  /// \brief Number of devices: the product of the axis sizes (1 for an empty mesh).
  int num_devices() const {
    int n = 1;
    for (const auto& a : m_axes) n *= a.size;
    return n;
  }
  /// \brief Index of the axis called \p name, or -1.
  int axis_index(std::string_view name) const {
    for (std::size_t i = 0; i < m_axes.size(); ++i)
      if (m_axes[i].name == name) return static_cast<int>(i);
    return -1;
  }
  /// \brief Size of the axis called \p name; 1 if absent.
  int axis_size(std::string_view name) const {
    const int i = axis_index(name);
    return i < 0 ? 1 : m_axes[i].size;
  }
  /// \brief The coordinate of \p device along every axis (row-major: the last axis varies fastest).
  std::vector<int> coordinates(int device) const {
    std::vector<int> c(m_axes.size());
    for (int i = rank() - 1; i >= 0; --i) {
      c[i] = device % m_axes[i].size;
      device /= m_axes[i].size;
    }
    return c;
  }
  /// \brief "dp2 x ep2" ("1" for an empty mesh).
  std::string str() const {
    std::string s;
    for (const auto& a : m_axes) s += (s.empty() ? "" : " x ") + a.name + std::to_string(a.size);
    return s.empty() ? "1" : s;
  }
  bool operator==(const Mesh& o) const { return m_axes == o.m_axes; }
  bool operator!=(const Mesh& o) const { return !(*this == o); }

 private:
  std::vector<MeshAxis> m_axes;
};

/// \brief How a tensor is laid out over a mesh: for every tensor dimension, the mesh axes it is split over
/// (major first; empty = that dimension is whole on every device). Mesh axes that appear nowhere replicate the
/// tensor. `partial` lists the axes over which each device holds an unreduced partial sum (a pending psum, e.g.
/// the token-sharded aux loss).
struct ShardingSpec {
  std::vector<std::vector<std::string>> dims;
  std::vector<std::string> partial;

  /// \brief Whole on every device.
  static ShardingSpec replicated(int rank) { return ShardingSpec{std::vector<std::vector<std::string>>(rank), {}}; }
  /// \brief Dimension 0 split over \p axes (the token axis), the other dimensions whole.
  static ShardingSpec split_dim0(std::vector<std::string> axes, int rank) {
    ShardingSpec s = replicated(rank);
    if (rank > 0) s.dims[0] = std::move(axes);
    return s;
  }
  int rank() const { return static_cast<int>(dims.size()); }
  bool is_split(int dim) const { return !dims.at(dim).empty(); }
  bool fully_replicated() const {
    return partial.empty() && std::all_of(dims.begin(), dims.end(), [](const auto& d) { return d.empty(); });
  }
  /// \brief JAX-like text: "P(('dp', 'ep'), None)", with " partial('dp')" appended when partial.
  std::string str() const {
    auto axes = [](const std::vector<std::string>& v) {
      std::string s = v.size() == 1 ? "" : "(";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", '" : "'") + v[i] + "'";
      return s + (v.size() == 1 ? "" : ")");
    };
    std::string s = "P(";
    for (std::size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + (dims[d].empty() ? "None" : axes(dims[d]));
    s += ")";
    if (!partial.empty()) s += " partial" + (partial.size() == 1 ? "(" + axes(partial) + ")" : axes(partial));
    return s;
  }
  bool operator==(const ShardingSpec& o) const { return dims == o.dims && partial == o.partial; }
  bool operator!=(const ShardingSpec& o) const { return !(*this == o); }
};

/// \brief Number of shards when a dimension is split over \p axes of \p mesh (the product of their sizes).
inline int num_shards(const Mesh& mesh, const std::vector<std::string>& axes) {
  int n = 1;
  for (const auto& a : axes) n *= mesh.axis_size(a);
  return n;
}

/// \brief The shard of a dimension split over \p axes that \p device holds: the mixed-radix number of its
/// coordinates along those axes, the first axis most significant.
inline int shard_index(const Mesh& mesh, const std::vector<std::string>& axes, int device) {
  const std::vector<int> c = mesh.coordinates(device);
  int idx = 0;
  for (const auto& a : axes) {
    const int i = mesh.axis_index(a);
    idx = idx * (i < 0 ? 1 : mesh.axes()[i].size) + (i < 0 ? 0 : c[i]);
  }
  return idx;
}

/// \brief Rows [first, second) of shard \p index when \p extent rows are split into \p shards contiguous blocks
/// (block sizes differ by at most one; the first `extent % shards` blocks are one longer).
inline std::pair<std::int64_t, std::int64_t> shard_range(std::int64_t extent, int shards, int index) {
  const std::int64_t base = extent / shards, rem = extent % shards;
  const std::int64_t begin = index * base + std::min<std::int64_t>(index, rem);
  return {begin, begin + base + (index < rem ? 1 : 0)};
}

}  // namespace KokkosMoE

#endif
