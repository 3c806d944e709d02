# Checks that every place that states which EP operations fence states it in the same words, the words of the
# list that the Kokkos Tools test asserts (docs/ep.md §7.4):
#   cmake -DSOURCE_DIR=<repository root> -P KokkosMoE_CheckFenceRule.cmake
#
# The rule is the text between `<!-- fence-rule -->` and `<!-- /fence-rule -->` in docs/ep.md and README.md, and
# between `fence-rule:` and `(end of fence-rule)` in the comments of comm/src/KokkosMoE_EP.hpp and of
# documented_fence() in unit_test/comm/tstEp.cpp. Comment prefixes (`///`, `//`), backquotes and line breaks are
# ignored. Fails on a difference or a missing marker.

cmake_minimum_required(VERSION 3.25)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "KokkosMoE_CheckFenceRule: set -DSOURCE_DIR=<repository root>")
endif()

# The rule in \p file between \p begin and \p end, normalized, into \p out.
function(fence_rule file begin end out)
  file(READ ${SOURCE_DIR}/${file} _text)
  string(FIND "${_text}" "${begin}" _at)
  if(_at LESS 0)
    message(FATAL_ERROR "${file}: no '${begin}' marker")
  endif()
  string(LENGTH "${begin}" _skip)
  math(EXPR _at "${_at} + ${_skip}")
  string(SUBSTRING "${_text}" ${_at} -1 _rest)
  string(FIND "${_rest}" "${end}" _end)
  if(_end LESS 0)
    message(FATAL_ERROR "${file}: no '${end}' marker after '${begin}'")
  endif()
  string(SUBSTRING "${_rest}" 0 ${_end} _rule)
  string(REGEX REPLACE "\n[ \t]*///?[ \t]*" " " _rule "${_rule}")
  string(REGEX REPLACE "^[ \t]*///?" "" _rule "${_rule}")
  string(REPLACE "`" "" _rule "${_rule}")
  string(REGEX REPLACE "[ \t\n]+" " " _rule "${_rule}")
  string(STRIP "${_rule}" _rule)
  set(${out} "${_rule}" PARENT_SCOPE)
endfunction()

fence_rule(docs/ep.md "<!-- fence-rule -->" "<!-- /fence-rule -->" _doc)
if(_doc STREQUAL "")
  message(FATAL_ERROR "docs/ep.md: the fence rule is empty")
endif()
set(_errors 0)
foreach(_place "README.md;<!-- fence-rule -->;<!-- /fence-rule -->"
               "comm/src/KokkosMoE_EP.hpp;fence-rule:;(end of fence-rule)"
               "unit_test/comm/tstEp.cpp;fence-rule:;(end of fence-rule)")
  list(GET _place 0 _file)
  list(GET _place 1 _begin)
  list(GET _place 2 _end)
  fence_rule(${_file} "${_begin}" "${_end}" _got)
  if(NOT _got STREQUAL _doc)
    message(SEND_ERROR "${_file} states the fence rule otherwise than docs/ep.md §7.4:\n  ${_got}\nnot\n  ${_doc}")
    math(EXPR _errors "${_errors} + 1")
  endif()
endforeach()
if(_errors GREATER 0)
  message(FATAL_ERROR "${_errors} statement(s) of the fence rule differ from docs/ep.md §7.4")
endif()
message(STATUS "the fence rule reads the same in docs/ep.md, README.md, KokkosMoE_EP.hpp and tstEp.cpp")
