# A Kokkos that this C++ compiler miscompiles is refused at configuration, with the reason, instead of crashing in
# the first program that copies a View.
#
# GCC 12.2-12.5 drops the call of SharedAllocationTracker's constexpr default constructor inside the defaulted
# constructors of Kokkos' mdspan-based View (Kokkos >= 4.5): a default-constructed View holds a null allocation
# record marked as counted, and the first copy into it (or its destruction after one) dereferences null
# (kokkos/kokkos#7464, #8187; fixed upstream by kokkos/kokkos#8223 and #9262, which make that constructor
# non-constexpr for those compilers). Debian 12's GCC is 12.2. The probe builds and runs four lines against the
# Kokkos found (no Kokkos::initialize needed); only host builds run it (a CUDA Kokkos needs a driver to run
# anything, and its host code passes through nvcc).
#
# Sets KokkosMoE_KOKKOS_PROBE_ERROR to the reason when the probe fails; empty otherwise.
set(KokkosMoE_KOKKOS_PROBE_ERROR "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13 AND Kokkos_VERSION VERSION_GREATER_EQUAL 4.5
   AND NOT "CUDA" IN_LIST Kokkos_DEVICES)
  if(NOT DEFINED KokkosMoE_KOKKOS_VIEW_COPY_WORKS OR NOT KokkosMoE_KOKKOS_PROBED_DIR STREQUAL Kokkos_DIR)
    set(_src ${CMAKE_BINARY_DIR}/CMakeFiles/kokkosmoe_probe/view_copy.cpp)
    file(WRITE ${_src} "#include <Kokkos_Core.hpp>\n"
                       "int main() {\n"
                       "  Kokkos::View<float*, Kokkos::HostSpace> a, b;\n"
                       "  a = b;  // both default-constructed: nothing to count\n"
                       "  return 0;\n"
                       "}\n")
    try_run(_run _compiled ${CMAKE_BINARY_DIR}/CMakeFiles/kokkosmoe_probe SOURCES ${_src}
            LINK_LIBRARIES Kokkos::kokkos CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
            COMPILE_OUTPUT_VARIABLE _compile_out RUN_OUTPUT_VARIABLE _run_out)
    if(NOT _compiled)
      message(FATAL_ERROR "KokkosMoE: a four-line program against the Kokkos found (${Kokkos_DIR}) does not "
                          "compile:\n${_compile_out}")
    endif()
    set(_works OFF)
    if(_run EQUAL 0)
      set(_works ON)
    endif()
    set(KokkosMoE_KOKKOS_VIEW_COPY_WORKS ${_works} CACHE INTERNAL "A default-constructed Kokkos View copies")
    set(KokkosMoE_KOKKOS_PROBED_DIR ${Kokkos_DIR} CACHE INTERNAL "The Kokkos the probe ran against")
  endif()
  if(NOT KokkosMoE_KOKKOS_VIEW_COPY_WORKS)
    string(CONCAT KokkosMoE_KOKKOS_PROBE_ERROR
        "the Kokkos found (${Kokkos_VERSION}, ${Kokkos_DIR}) is miscompiled by ${CMAKE_CXX_COMPILER_ID} "
        "${CMAKE_CXX_COMPILER_VERSION}: copying one default-constructed Kokkos::View into another crashes (GCC 12 "
        "skips SharedAllocationTracker's constexpr default constructor, kokkos/kokkos#7464 and #8187). Use a Kokkos "
        "with kokkos/kokkos#8223 (and #9262 for GCC 12.5), or build Kokkos with that constructor non-constexpr "
        "(core/src/impl/Kokkos_SharedAlloc.hpp; .ci/kokkos4 shows how), or another compiler (GCC >= 13, Clang).")
  endif()
endif()
