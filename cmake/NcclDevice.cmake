# Locates NCCL with the device API (nccl_device.h) for USE_NCCL_DEVICE=ON and
# checks its version: NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION_CODE.
# NCCL_ROOT (cache or environment) points at a non-default install.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda)
find_path(NCCL_INCLUDE_DIR nccl_device.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "USE_NCCL_DEVICE=ON needs NCCL with the device API (nccl_device.h and "
                      "libnccl): set NCCL_ROOT (found headers: '${NCCL_INCLUDE_DIR}', "
                      "library: '${NCCL_LIBRARY}')")
endif()
file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_code REGEX "^#define NCCL_VERSION_CODE ")
string(REGEX REPLACE "^#define NCCL_VERSION_CODE ([0-9]+).*" "\\1" NCCL_VERSION_CODE "${_nccl_code}")
# The device API and GIN this transport was written and reviewed against:
# 2.28.9 (the upstream text names 2.30.4; we gate on what we have reviewed).
# python/mooncake/_ep_transport.py (NCCL_MIN_VERSION) checks the same floor
# and that the libnccl loaded at run time is this very version.
set(MOONCAKE_NCCL_MIN_VERSION 22809)
if(NOT NCCL_VERSION_CODE OR NCCL_VERSION_CODE LESS MOONCAKE_NCCL_MIN_VERSION)
  message(FATAL_ERROR "USE_NCCL_DEVICE=ON needs NCCL >= 2.28.9 (NCCL_VERSION_CODE "
                      "${MOONCAKE_NCCL_MIN_VERSION}); ${NCCL_INCLUDE_DIR}/nccl.h is "
                      "'${NCCL_VERSION_CODE}'")
endif()
message(STATUS "NCCL device API: ${NCCL_INCLUDE_DIR} (NCCL_VERSION_CODE ${NCCL_VERSION_CODE}), "
               "${NCCL_LIBRARY}")
