# The one place that decides how sources that include Kokkos headers are compiled (docs/conventions.md §1).
# Included after find_package(Kokkos) by the top-level CMakeLists.txt and by the installed KokkosMoEConfig.cmake, so
# the project and its consumers decide alike, from the Kokkos actually found.
#
# A CUDA Kokkos is installed one of two ways, and its KokkosConfig.cmake says which in Kokkos_COMPILE_LANGUAGE
# (exported since Kokkos 3.6; Kokkos' own example build_cmake_installed_kk_as_language uses it the same way):
#   CUDA  built with Kokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE=ON. Kokkos::kokkos gives its flags (-extended-lambda, ...)
#         to CUDA sources only, so the Kokkos sources are compiled as CUDA by CMake's CUDA compiler (nvcc).
#   CXX   built with CMAKE_CXX_COMPILER=nvcc_wrapper. Kokkos::kokkos gives its flags (-extended-lambda, -arch, ...)
#         to CXX sources only, so the Kokkos sources stay CXX and the C++ compiler must be nvcc_wrapper too.
# A Kokkos without the Cuda backend: CXX, with any C++ compiler.
#
# Either way the native .cu kernels (core/src/cuda, which include no Kokkos header) are CUDA sources compiled by
# nvcc; the top-level CMakeLists.txt enables the CUDA language for them.
#
# Results, in the including scope:
#   KokkosMoE_KOKKOS_LANGUAGE        CUDA or CXX
#   KokkosMoE_KOKKOS_LANGUAGE_ERROR  empty, or why this C++ compiler cannot build against this Kokkos (the caller
#                                    stops: FATAL_ERROR in the project, package not found in the config file)
# and the function kokkosmoe_kokkos_sources(<source>...), which marks sources of the current directory as Kokkos
# sources (LANGUAGE ${KokkosMoE_KOKKOS_LANGUAGE}).

set(KokkosMoE_KOKKOS_LANGUAGE CXX)
set(KokkosMoE_KOKKOS_LANGUAGE_ERROR "")
if("CUDA" IN_LIST Kokkos_DEVICES)
  if(DEFINED Kokkos_COMPILE_LANGUAGE)
    set(KokkosMoE_KOKKOS_LANGUAGE ${Kokkos_COMPILE_LANGUAGE})
  elseif(Kokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE)
    set(KokkosMoE_KOKKOS_LANGUAGE CUDA) # a Kokkos older than 3.6 that has the option but does not export the language
  endif()
  if(NOT KokkosMoE_KOKKOS_LANGUAGE MATCHES "^(CUDA|CXX)$")
    string(CONCAT KokkosMoE_KOKKOS_LANGUAGE_ERROR
        "the Kokkos found (${Kokkos_DIR}) compiles its sources as ${KokkosMoE_KOKKOS_LANGUAGE}; only CUDA and CXX "
        "are supported.")
  elseif(KokkosMoE_KOKKOS_LANGUAGE STREQUAL "CXX" AND NOT Kokkos_CXX_COMPILER_ID STREQUAL "NVIDIA")
    string(CONCAT KokkosMoE_KOKKOS_LANGUAGE_ERROR
        "the Kokkos found (${Kokkos_DIR}) compiles CUDA as C++ with ${Kokkos_CXX_COMPILER_ID} "
        "(${Kokkos_CXX_COMPILER}); the supported CUDA Kokkos installs are built with nvcc_wrapper as the C++ "
        "compiler or with -DKokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE=ON.")
  elseif(KokkosMoE_KOKKOS_LANGUAGE STREQUAL "CXX")
    # Kokkos was built with nvcc_wrapper: the C++ compiler must be nvcc_wrapper as well. This is the test Kokkos'
    # KokkosConfig.cmake makes (`--version` names nvcc); with another compiler Kokkos would only redirect compile
    # lines through kokkos_launch_compiler, which this project does not support.
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} --version OUTPUT_VARIABLE _kokkosmoe_cxx_version
                    ERROR_QUIET RESULT_VARIABLE _kokkosmoe_cxx_rc)
    if(NOT _kokkosmoe_cxx_rc EQUAL 0 OR NOT _kokkosmoe_cxx_version MATCHES "nvcc")
      get_filename_component(_kokkosmoe_wrapper "${Kokkos_DIR}/../../../bin/nvcc_wrapper" ABSOLUTE)
      if(NOT EXISTS "${_kokkosmoe_wrapper}")
        set(_kokkosmoe_wrapper "${Kokkos_CXX_COMPILER}")
      endif()
      string(CONCAT KokkosMoE_KOKKOS_LANGUAGE_ERROR
          "the Kokkos found (${Kokkos_DIR}) is a CUDA Kokkos built with nvcc_wrapper as its C++ compiler "
          "(Kokkos_COMPILE_LANGUAGE=CXX), so the C++ compiler must be nvcc_wrapper too, but CMAKE_CXX_COMPILER is "
          "${CMAKE_CXX_COMPILER}. Configure a fresh build folder with -DCMAKE_CXX_COMPILER=${_kokkosmoe_wrapper} "
          "(or use a Kokkos built with -DKokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE=ON).")
    endif()
    unset(_kokkosmoe_cxx_version)
    unset(_kokkosmoe_cxx_rc)
    unset(_kokkosmoe_wrapper)
  endif()
endif()

# Sources (of the calling directory) that include Kokkos headers: compiled in the language Kokkos' flags are for.
function(kokkosmoe_kokkos_sources)
  if(KokkosMoE_KOKKOS_LANGUAGE STREQUAL "CUDA")
    set_source_files_properties(${ARGN} DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} PROPERTIES LANGUAGE CUDA)
  endif()
endfunction()
