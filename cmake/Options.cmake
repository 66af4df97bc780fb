# Build options. "auto" options follow what the machine has; each can be forced.

option(BUILD_TESTING "Build the GoogleTest suites" ON)

# USE_CUDA, nvcc's host compiler and what CUDA objects add to link lines.
include(${CMAKE_CURRENT_LIST_DIR}/CudaLanguage.cmake)

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
# mlx5dv.h (the same package) for IBGDA's queue pairs.
find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
find_path(MLX5DV_INCLUDE_DIR infiniband/mlx5dv.h)
if(WITH_RDMA STREQUAL "AUTO")
  if(IBVERBS_INCLUDE_DIR AND MLX5DV_INCLUDE_DIR)
    set(WITH_RDMA ON)
  else()
    set(WITH_RDMA OFF)
  endif()
endif()
if(WITH_RDMA AND NOT (IBVERBS_INCLUDE_DIR AND MLX5DV_INCLUDE_DIR))
  message(FATAL_ERROR "WITH_RDMA=ON needs rdma-core's headers (infiniband/verbs.h and "
                      "infiniband/mlx5dv.h): apt-get install libibverbs-dev")
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
