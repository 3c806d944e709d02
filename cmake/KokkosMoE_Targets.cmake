# Helpers shared by the component CMakeLists.

# kokkosmoe_kokkos_sources(<source>...), which marks the sources that include Kokkos headers, comes from
# KokkosMoE_KokkosLanguage.cmake (the one place that decides their language).

# A component library: kokkosmoe_<name>, alias KokkosMoE::<name>, public headers from src/ (and src/impl,
# src/kokkos_ext, src/cuda through their relative include paths).
function(kokkosmoe_add_component name)
  cmake_parse_arguments(ARG "" "" "SOURCES;KOKKOS_SOURCES;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  add_library(kokkosmoe_${name} ${ARG_SOURCES} ${ARG_KOKKOS_SOURCES})
  add_library(KokkosMoE::${name} ALIAS kokkosmoe_${name})
  kokkosmoe_kokkos_sources(${ARG_KOKKOS_SOURCES})
  set_target_properties(kokkosmoe_${name} PROPERTIES EXPORT_NAME ${name} POSITION_INDEPENDENT_CODE ON)
  target_include_directories(kokkosmoe_${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/src>
                                                      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(kokkosmoe_${name} PUBLIC ${ARG_PUBLIC_LIBS} PRIVATE ${ARG_PRIVATE_LIBS})
  target_compile_features(kokkosmoe_${name} PUBLIC cxx_std_17)
  install(TARGETS kokkosmoe_${name} EXPORT KokkosMoETargets)
  # Headers keep their paths below src/ (impl/, cuda/, kokkos_ext/). One install() per file, so that a folder
  # without headers is never created in the prefix (install(DIRECTORY) with FILES_MATCHING creates every folder).
  file(GLOB_RECURSE _headers RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}/src CONFIGURE_DEPENDS
       ${CMAKE_CURRENT_SOURCE_DIR}/src/*.hpp)
  foreach(_header IN LISTS _headers)
    get_filename_component(_dir ${_header} DIRECTORY)
    install(FILES src/${_header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${_dir})
  endforeach()
endfunction()

# A Boost.Test executable with one ctest entry per top-level test suite, so ctest reports every suite.
#   kokkosmoe_add_boost_test(NAME exe SOURCES ... LIBS ... SUITES s1 s2 ... [LABELS ...])
function(kokkosmoe_add_boost_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LIBS;SUITES;LABELS;ENVIRONMENT" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  kokkosmoe_kokkos_sources(${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} kokkosmoe_test_support)
  # line tables (no change to the code) so that compute-sanitizer names the source line of a device-side report
  target_compile_options(${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  foreach(suite IN LISTS ARG_SUITES)
    add_test(NAME ${ARG_NAME}.${suite} COMMAND ${ARG_NAME} --run_test=${suite} --report_level=short)
    set_tests_properties(${ARG_NAME}.${suite} PROPERTIES TIMEOUT ${ARG_TIMEOUT} SKIP_RETURN_CODE 77
                                                         LABELS "${ARG_LABELS}" ENVIRONMENT "${ARG_ENVIRONMENT}")
  endforeach()
endfunction()
