"""A module holding CUDA objects links the shared libstdc++ whatever nvcc's host compiler is.

On the GPU machine nvcc's host compiler (CUDAHOSTCXX=/opt/gcc/bin/g++) has a
library directory of its own. CMake used to put that directory on the link
line of every C++-linked target holding CUDA objects, `-lstdc++` found a
static libstdc++ there, and the torch modules carried a second libstdc++ next
to torch's: every rank crashed in init_process_group. cmake/CudaLanguage.cmake
keeps such directories off C++ link lines. This test builds a small module
with that file alone and a host compiler whose directory holds only
libstdc++.a; it needs nvcc and cmake, not a GPU.
"""

import os
import shutil
import subprocess
import textwrap

import pytest

import test_module_linkage as linkage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _need(tool):
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"`{tool}` is not on PATH: cannot build the CUDA link check")
    return path


def test_module_with_cuda_objects_links_the_shared_libstdcxx(tmp_path):
    _need("nvcc")
    cmake = _need("cmake")
    gxx = _need("g++")
    static = subprocess.run([gxx, "-print-file-name=libstdc++.a"], capture_output=True,
                            text=True, check=True).stdout.strip()
    if not os.path.isabs(static):
        pytest.skip("g++ has no static libstdc++ (libstdc++.a) to plant")

    # The host compiler: the real g++, with a library directory holding only
    # the static libstdc++.
    libdir = tmp_path / "hostlib"
    libdir.mkdir()
    shutil.copy(static, libdir / "libstdc++.a")
    host = tmp_path / "host-g++"
    host.write_text(f'#!/bin/sh\nexec {gxx} -L{libdir} "$@"\n')
    host.chmod(0o755)

    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(textwrap.dedent(f"""\
        cmake_minimum_required(VERSION 3.22)
        project(cuda_link LANGUAGES C CXX)
        set(USE_CUDA ON)
        include({REPO}/cmake/CudaLanguage.cmake)
        add_library(kernels STATIC kernels.cu)
        set_target_properties(kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
        add_library(mod MODULE mod.cc)
        target_link_libraries(mod PRIVATE kernels CUDA::cudart)
        """))
    (src / "kernels.cu").write_text(textwrap.dedent("""\
        __global__ void fill(int* p) { p[threadIdx.x] = threadIdx.x; }
        void launchFill(int* p) { fill<<<1, 32>>>(p); }
        """))
    (src / "mod.cc").write_text(textwrap.dedent("""\
        #include <sstream>
        #include <string>
        void launchFill(int* p);
        extern "C" int describe(long v, char* out, int n) {
            std::ostringstream s;
            s << v;
            launchFill(nullptr);
            return s.str().copy(out, n);
        }
        """))
    build = tmp_path / "build"
    env = {**os.environ, "CUDAHOSTCXX": str(host), "CXX": gxx}
    cfg = subprocess.run([cmake, "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                          "-DCMAKE_CUDA_ARCHITECTURES=90"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    # The condition of the crash holds: CMake learnt the planted directory
    # from nvcc's host compiler.
    learnt = "\n".join(p.read_text() for p in build.glob("CMakeFiles/*/CMakeCUDACompiler.cmake"))
    assert str(libdir) in learnt, "the host compiler's library directory was not picked up"
    made = subprocess.run([cmake, "--build", str(build), "-j", "2"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]

    module = str(build / "libmod.so")
    assert linkage.defined_libstdcxx_symbols(module) == [], \
        "the module carries a static libstdc++ (cmake/CudaLanguage.cmake)"
    assert any(lib.startswith("libstdc++.so") for lib in linkage.needed_libraries(module))
