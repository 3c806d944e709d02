# Finds NCCL (nccl.h + libnccl) and defines NCCL::nccl. Hints: NCCL_ROOT, the CUDA toolkit's folders.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda
             PATH_SUFFIXES lib lib64)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _maj REGEX "^#define NCCL_MAJOR")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _min REGEX "^#define NCCL_MINOR")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _pat REGEX "^#define NCCL_PATCH")
  string(REGEX MATCH "[0-9]+" _maj "${_maj}")
  string(REGEX MATCH "[0-9]+" _min "${_min}")
  string(REGEX MATCH "[0-9]+" _pat "${_pat}")
  set(NCCL_VERSION "${_maj}.${_min}.${_pat}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
