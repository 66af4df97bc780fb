"""Builds the Mooncake PG/EP extension modules with CMake.

    python setup.py build_ext --inplace   # modules land in python/mooncake/
    pip install . --no-build-isolation     # installs the package

The C++ build lives in $MOONCAKE_BUILD_DIR (default ./build) so rebuilds are
incremental. Modules carry the torch version suffix (pg_2_11_0, ...).
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run(self):
        build_dir = os.environ.get("MOONCAKE_BUILD_DIR", os.path.join(ROOT, "build"))
        os.makedirs(build_dir, exist_ok=True)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        args = [
            "cmake", "-S", ROOT, "-B", build_dir, *generator,
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DWITH_TORCH=ON",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('MOONCAKE_BUILD_TYPE', 'RelWithDebInfo')}",
        ]
        for opt in ("USE_CUDA", "WITH_EP", "WITH_RDMA", "USE_NCCL_DEVICE", "BUILD_TESTING", "BUILD_FUZZERS",
                    "CMAKE_CUDA_ARCHITECTURES"):
            if opt in os.environ:
                args.append(f"-D{opt}={os.environ[opt]}")
        subprocess.check_call(args)
        jobs = os.environ.get("MOONCAKE_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs])
        modules = glob.glob(os.path.join(build_dir, "python", "mooncake", "*.so"))
        if not modules:
            raise RuntimeError(f"no extension modules were built in {build_dir}")
        if self.inplace:
            dest = os.path.join(ROOT, "python", "mooncake")
        else:
            dest = os.path.join(os.path.abspath(self.build_lib), "mooncake")
        os.makedirs(dest, exist_ok=True)
        for m in modules:
            shutil.copy2(m, dest)


setup(
    name="mooncake-pg-ep",
    version="0.1.0",
    description="Mooncake PG (torch.distributed backend) and EP runtime",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("mooncake._cmake")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    zip_safe=False,
)
