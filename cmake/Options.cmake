# Build options. "auto" options follow what the machine has; each can be forced.
include(CheckLanguage)

option(BUILD_TESTING "Build the GoogleTest suites" ON)

# nvcc's host compiler is the C++ compiler unless CUDAHOSTCXX names one.
if(NOT CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX}
   AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
endif()

set(USE_CUDA "AUTO" CACHE STRING "Build CUDA code: ON, OFF or AUTO (when nvcc is found)")
if(USE_CUDA STREQUAL "AUTO")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(USE_CUDA ON)
  else()
    set(USE_CUDA OFF)
  endif()
endif()
if(USE_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  # One CUDA runtime per process: torch loads libcudart.so, so our CUDA
  # objects must call that copy, not nvcc's default static one. A module
  # holding its own static runtime next to torch's crashed in
  # init_process_group (tests/python/test_module_linkage.py guards this).
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  # A target linked by the C++ compiler that holds CUDA objects (the torch
  # modules) gets only the toolkit's own directories, not the rest of what
  # CMake learnt from nvcc's host compiler: on the GPU machine that compiler's
  # library directory (CUDAHOSTCXX=/opt/gcc/bin/g++) came first on the
  # module's link line, -lstdc++ found a static libstdc++ there, and the
  # module carried a second libstdc++ next to torch's: every rank crashed in
  # init_process_group (tests/python/test_module_linkage.py guards this).
  set(CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES "${CMAKE_CUDA_HOST_IMPLICIT_LINK_DIRECTORIES}")
  set(CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES "${CMAKE_CUDA_HOST_IMPLICIT_LINK_LIBRARIES}")
  find_package(CUDAToolkit REQUIRED)
endif()

set(_with_ep_default OFF)
if(USE_CUDA)
  set(_with_ep_default ON)
endif()
option(WITH_EP "Build the expert-parallel runtime (needs CUDA)" ${_with_ep_default})
if(WITH_EP AND NOT USE_CUDA)
  message(FATAL_ERROR "WITH_EP=ON needs USE_CUDA=ON")
endif()

set(WITH_RDMA "AUTO" CACHE STRING "Build the RDMA transport: ON, OFF or AUTO (when rdma-core's headers are found)")
# Only the headers are needed: libibverbs is loaded at run time, so the
# library works on hosts without rdma-core. apt: libibverbs-dev.
find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
if(WITH_RDMA STREQUAL "AUTO")
  if(IBVERBS_INCLUDE_DIR)
    set(WITH_RDMA ON)
  else()
    set(WITH_RDMA OFF)
  endif()
endif()
if(WITH_RDMA AND NOT IBVERBS_INCLUDE_DIR)
  message(FATAL_ERROR "WITH_RDMA=ON needs rdma-core's headers (infiniband/verbs.h): "
                      "apt-get install libibverbs-dev")
endif()

option(USE_NCCL_DEVICE "Build the NCCL device-API (GIN) EP transport" OFF)

set(WITH_TORCH "AUTO" CACHE STRING "Build the torch extension modules: ON, OFF or AUTO")
find_package(Python3 COMPONENTS Interpreter Development.Module)
if(WITH_TORCH STREQUAL "AUTO")
  set(WITH_TORCH OFF)
  if(Python3_EXECUTABLE)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch"
                    RESULT_VARIABLE _torch_missing OUTPUT_QUIET ERROR_QUIET)
    if(_torch_missing EQUAL 0)
      set(WITH_TORCH ON)
    endif()
  endif()
endif()

# libFuzzer targets need clang; with another compiler they build as plain
# replay drivers that run a corpus and a bounded number of random inputs.
option(BUILD_FUZZERS "Build the fuzz targets" ON)
