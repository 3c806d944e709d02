#!/usr/bin/env bash
# KokkosMoE setup: installs the Debian packages the project needs and provides a host Kokkos.
#
# Kokkos precedence: a Kokkos_ROOT given by the user (environment) > the cached build made here > nothing.
# The cached build is Kokkos 3.4.01 (OpenMP + Serial) taken from Debian's `trilinos` *source* package; the
# Trilinos binary package ships a Serial-only Kokkos with a broken CMake config and is never used.
#
# Idempotent and non-interactive; a re-run with everything in place takes seconds.
# Prints `KOKKOS_ROOT=<path>` as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${KOKKOSMOE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kokkosmoe}
kokkos_prefix=$cache/kokkos-3.4.01-openmp
log() { printf '[setup] %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

# ---------------------------------------------------------------------------------------------------------------
# 1. Debian packages
# ---------------------------------------------------------------------------------------------------------------
pkgs=(build-essential cmake ninja-build pkg-config libhwloc-dev libboost-test1.81-dev libbenchmark-dev
      nlohmann-json3-dev libopenmpi-dev openmpi-bin xz-utils dpkg-dev clang libclang-rt-14-dev clang-format
      libhwloc-plugins)  # hwloc's libxml2 XML importer: the topology suites run with it and with the built-in one
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
apt_updated=0
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  apt_updated=1
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------------------------------------------------------
# 2. Kokkos
# ---------------------------------------------------------------------------------------------------------------
if [ -n "${Kokkos_ROOT:-}" ]; then
  log "using the user's Kokkos_ROOT=$Kokkos_ROOT"
  echo "KOKKOS_ROOT=$Kokkos_ROOT"
  exit 0
fi
if [ -f "$kokkos_prefix/lib/cmake/Kokkos/KokkosConfig.cmake" ] || [ -f "$kokkos_prefix/lib64/cmake/Kokkos/KokkosConfig.cmake" ]; then
  log "cached Kokkos found in $kokkos_prefix"
  echo "KOKKOS_ROOT=$kokkos_prefix"
  exit 0
fi

# Add a deb-src entry derived from the machine's own apt sources (no host name is written in this repo).
srcfile=/etc/apt/sources.list.d/kokkosmoe-deb-src.sources
if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  log "adding deb-src entries derived from the existing apt sources"
  tmp=$(mktemp)
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822: copy each stanza whose Types has `deb` and whose Suites is a Debian suite, with Types: deb-src.
    awk 'BEGIN{RS=""; ORS="\n\n"} /(^|\n)Types:[^\n]*deb([ \n]|$)/ && /(^|\n)Suites:[^\n]*(bookworm|stable)/ {
           gsub(/(^|\n)Types:[^\n]*/, "\nTypes: deb-src"); sub(/^\n/, ""); print }' "$f" >>"$tmp"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    grep -E '^deb [^#]*(bookworm|stable)' "$f" | sed 's/^deb /deb-src /' >>"${tmp}.list" || true
  done
  if [ -s "$tmp" ]; then $SUDO cp "$tmp" "$srcfile"; fi
  if [ -s "${tmp}.list" ]; then $SUDO cp "${tmp}.list" /etc/apt/sources.list.d/kokkosmoe-deb-src.list; fi
  rm -f "$tmp" "${tmp}.list"
  apt_updated=0
fi
if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq; fi

mkdir -p "$cache/src"
cd "$cache/src"
if ! ls trilinos_13.2.0*.orig.tar.* >/dev/null 2>&1; then
  log "downloading Debian's trilinos source package (download only)"
  apt-get source --download-only -qq trilinos=13.2.0* >/dev/null 2>&1 || apt-get source --download-only -qq trilinos >/dev/null
fi
tarball=$(ls trilinos_*.orig.tar.* | head -n 1)
if [ ! -d kokkos-src ]; then
  log "extracting packages/kokkos from $tarball"
  rm -rf extract && mkdir extract
  tar -xf "$tarball" -C extract --wildcards '*/packages/kokkos/*'
  mv extract/*/packages/kokkos kokkos-src
  rm -rf extract
fi

log "building Kokkos (OpenMP + Serial) into $kokkos_prefix"
rm -rf "$cache/kokkos-build"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S kokkos-src -B "$cache/kokkos-build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$kokkos_prefix" -DCMAKE_CXX_STANDARD=17 -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_TESTS=OFF >"$cache/kokkos-configure.log" 2>&1 \
  || { cat "$cache/kokkos-configure.log" >&2; exit 1; }
cmake --build "$cache/kokkos-build" -j"$(nproc)" >"$cache/kokkos-build.log" 2>&1 || { tail -50 "$cache/kokkos-build.log" >&2; exit 1; }
cmake --install "$cache/kokkos-build" >/dev/null
rm -rf "$cache/kokkos-build"
echo "KOKKOS_ROOT=$kokkos_prefix"
