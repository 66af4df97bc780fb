# Locates torch through the Python interpreter and defines
# mooncake_add_torch_extension(<base> SOURCES ... LIBS ...), which builds a Python
# module named <base>_<torch version suffix> (e.g. pg_2_11_0).
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__.split('+')[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); import os; print(os.path.dirname(torch.__file__))"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "WITH_TORCH=ON but 'import torch' failed in ${Python3_EXECUTABLE}")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 _torch_prefix)
list(GET _torch_info 1 MOONCAKE_TORCH_VERSION)
list(GET _torch_info 2 MOONCAKE_TORCH_CXX11_ABI)
list(GET _torch_info 3 MOONCAKE_TORCH_DIR)
string(REPLACE "." "_" MOONCAKE_TORCH_SUFFIX "${MOONCAKE_TORCH_VERSION}")

# Only the headers and libraries are needed; torch's CMake config would also
# demand a CUDA toolchain that matches its own build, so we locate them directly.
set(TORCH_INCLUDE_DIRS
  ${MOONCAKE_TORCH_DIR}/include
  ${MOONCAKE_TORCH_DIR}/include/torch/csrc/api/include)
find_library(TORCH_LIB torch PATHS ${MOONCAKE_TORCH_DIR}/lib NO_DEFAULT_PATH REQUIRED)
find_library(TORCH_CPU_LIB torch_cpu PATHS ${MOONCAKE_TORCH_DIR}/lib NO_DEFAULT_PATH REQUIRED)
find_library(C10_LIB c10 PATHS ${MOONCAKE_TORCH_DIR}/lib NO_DEFAULT_PATH REQUIRED)
find_library(TORCH_PYTHON_LIB torch_python PATHS ${MOONCAKE_TORCH_DIR}/lib NO_DEFAULT_PATH REQUIRED)
if(USE_CUDA)
  find_library(TORCH_CUDA_LIB torch_cuda PATHS ${MOONCAKE_TORCH_DIR}/lib NO_DEFAULT_PATH)
  find_library(C10_CUDA_LIB c10_cuda PATHS ${MOONCAKE_TORCH_DIR}/lib NO_DEFAULT_PATH)
endif()
message(STATUS "torch ${MOONCAKE_TORCH_VERSION} at ${MOONCAKE_TORCH_DIR} (CXX11 ABI ${MOONCAKE_TORCH_CXX11_ABI})")

# A static library of torch-using code that several extension modules link
# (compiled with the same torch headers, ABI and warnings as the modules).
function(mooncake_add_torch_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} SYSTEM PUBLIC ${TORCH_INCLUDE_DIRS})
  target_include_directories(${name} PUBLIC ${MOONCAKE_SOURCE_ROOT})
  target_compile_definitions(${name} PUBLIC _GLIBCXX_USE_CXX11_ABI=${MOONCAKE_TORCH_CXX11_ABI})
  target_link_libraries(${name} PUBLIC ${ARG_LIBS})
  target_compile_options(${name} PRIVATE -Wall -Wextra -Werror -Wno-unused-parameter)
endfunction()

function(mooncake_add_torch_extension base)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  set(name ${base}_${MOONCAKE_TORCH_SUFFIX})
  Python3_add_library(${name} MODULE WITH_SOABI ${ARG_SOURCES})
  target_include_directories(${name} SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
  target_include_directories(${name} PRIVATE ${MOONCAKE_SOURCE_ROOT})
  target_compile_definitions(${name} PRIVATE
    _GLIBCXX_USE_CXX11_ABI=${MOONCAKE_TORCH_CXX11_ABI}
    TORCH_EXTENSION_NAME=${name}
    MOONCAKE_TORCH_VERSION="${MOONCAKE_TORCH_VERSION}")
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} ${TORCH_LIB} ${TORCH_CPU_LIB} ${C10_LIB}
                        ${TORCH_PYTHON_LIB})
  if(USE_CUDA AND TORCH_CUDA_LIB)
    target_link_libraries(${name} PRIVATE ${TORCH_CUDA_LIB} ${C10_CUDA_LIB})
  endif()
  # torch's own headers trip -Wextra (unused parameters); our code keeps -Werror.
  target_compile_options(${name} PRIVATE -Wall -Wextra -Werror -Wno-unused-parameter)
  set_target_properties(${name} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/python/mooncake
    BUILD_RPATH "${MOONCAKE_TORCH_DIR}/lib"
    INSTALL_RPATH "${MOONCAKE_TORCH_DIR}/lib")
endfunction()
