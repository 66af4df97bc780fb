# The CUDA language: USE_CUDA (ON, OFF or AUTO), nvcc's host compiler, the
# shared CUDA runtime, and what targets holding CUDA objects add to a C++
# link line. Included by Options.cmake; tests/python/test_cuda_link.py
# builds a small module with it alone.
include(CheckLanguage)

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
