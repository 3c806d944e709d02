# cmake -P script run by ctest (see CMakeLists.txt beside it).
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: '${ARGN}' failed (${rc}):\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORK_DIR}/prefix)
set(_arch)
if(CUDA_ARCHITECTURES)
  set(_arch -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES})
endif()
# The consumer is compiled and linked with the project's own flags: a sanitizer build installs instrumented
# libraries, which link only into instrumented programs (.ci/sanitize).
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
    ${_arch} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
