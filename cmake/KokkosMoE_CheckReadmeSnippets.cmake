# Checks that the README's code snippets are the examples' own text, so that they cannot drift from programs that
# build and run (the install test builds and runs examples/).
#   cmake -DSOURCE_DIR=<repository root> -P KokkosMoE_CheckReadmeSnippets.cmake
#
# A snippet in README.md is a line `<!-- examples/<file>.cpp [<name>] -->` followed by a ```cpp block; the block
# must equal the lines of examples/<file>.cpp between its two `//! [<name>]` marker lines (Doxygen's \snippet
# markers), less the first marker's indentation. Fails on a mismatch, a missing file or marker, and a README
# without snippets.

cmake_minimum_required(VERSION 3.25)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "KokkosMoE_CheckReadmeSnippets: set -DSOURCE_DIR=<repository root>")
endif()

file(READ ${SOURCE_DIR}/README.md _readme)
string(REGEX MATCHALL "<!-- examples/[A-Za-z0-9_]+\\.cpp \\[[A-Za-z0-9_-]+\\] -->" _markers "${_readme}")
if(NOT _markers)
  message(FATAL_ERROR "README.md quotes no example (no <!-- examples/<file>.cpp [<name>] --> line)")
endif()

set(_errors 0)
foreach(_marker IN LISTS _markers)
  string(REGEX REPLACE "<!-- (examples/[^ ]+) \\[([^]]+)\\] -->" "\\1" _file "${_marker}")
  string(REGEX REPLACE "<!-- (examples/[^ ]+) \\[([^]]+)\\] -->" "\\2" _name "${_marker}")

  # The README's block: after the marker line, between ```cpp and ```.
  string(FIND "${_readme}" "${_marker}\n```cpp\n" _at)
  if(_at LESS 0)
    message(SEND_ERROR "README.md: '${_marker}' is not followed by a ```cpp block")
    math(EXPR _errors "${_errors} + 1")
    continue()
  endif()
  string(LENGTH "${_marker}\n```cpp\n" _skip)
  math(EXPR _at "${_at} + ${_skip}")
  string(SUBSTRING "${_readme}" ${_at} -1 _rest)
  string(FIND "${_rest}" "```" _end)
  string(SUBSTRING "${_rest}" 0 ${_end} _quoted)

  # The example's text between its markers.
  if(NOT EXISTS ${SOURCE_DIR}/${_file})
    message(SEND_ERROR "README.md quotes ${_file}, which does not exist")
    math(EXPR _errors "${_errors} + 1")
    continue()
  endif()
  file(READ ${SOURCE_DIR}/${_file} _source)
  string(REGEX MATCH "\n([ ]*)//! \\[${_name}\\]\n" _open "${_source}")
  if(NOT _open)
    message(SEND_ERROR "${_file} has no '//! [${_name}]' marker that README.md quotes")
    math(EXPR _errors "${_errors} + 1")
    continue()
  endif()
  set(_indent "${CMAKE_MATCH_1}")
  string(FIND "${_source}" "${_open}" _at)
  string(LENGTH "${_open}" _skip)
  math(EXPR _at "${_at} + ${_skip}")
  string(SUBSTRING "${_source}" ${_at} -1 _rest)
  string(FIND "${_rest}" "${_indent}//! [${_name}]\n" _end)
  if(_end LESS 0)
    message(SEND_ERROR "${_file}: the marker '//! [${_name}]' is not closed")
    math(EXPR _errors "${_errors} + 1")
    continue()
  endif()
  string(SUBSTRING "${_rest}" 0 ${_end} _region)
  # Dedent: the marker's indentation off every line (blank lines have none).
  set(_region "\n${_region}")
  if(_indent)
    string(REPLACE "\n${_indent}" "\n" _region "${_region}")
  endif()
  string(SUBSTRING "${_region}" 1 -1 _region)

  if(NOT _quoted STREQUAL _region)
    message(SEND_ERROR "README.md's snippet ${_file} [${_name}] differs from the example's text. The example "
                       "has:\n${_region}\nREADME.md has:\n${_quoted}")
    math(EXPR _errors "${_errors} + 1")
  endif()
endforeach()

list(LENGTH _markers _count)
if(_errors GREATER 0)
  message(FATAL_ERROR "${_errors} of ${_count} README snippets do not match their examples")
endif()
message(STATUS "README snippets: ${_count}, all verbatim from examples/")
