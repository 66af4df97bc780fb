"""The extension modules use the CUDA runtime and libstdc++ torch loads, never copies of their own.

A module linked with nvcc's default static runtime (libcudart_static.a) carries
a second CUDA runtime next to torch's libcudart.so: on the GPU machine every
rank then died with SIGSEGV in init_process_group. The build links the shared
runtime (cmake/Options.cmake, CUDA_RUNTIME_LIBRARY Shared); these checks read
the built modules' symbol tables so that the static copy cannot come back
unnoticed. They need no GPU.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

import mooncake

MODULE_DIR = os.path.dirname(mooncake.__file__)
# The CUDA runtime API (cudaMalloc, cudaLaunchKernel, ...) and its internals.
RUNTIME_SYMBOL = re.compile(r"^(cuda[A-Z]\w*|__cudart\w*|cudart::.*|_ZN6cudart.*)$")


def _modules():
    return sorted(glob.glob(os.path.join(MODULE_DIR, "pg_*.so")) +
                  glob.glob(os.path.join(MODULE_DIR, "ep_*.so")))


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"`{name}` (binutils) is not installed: cannot read the modules' symbols")
    return path


def _symbols(path, *flags):
    """(name, type) of the symbols `nm` lists, C++ names demangled."""
    out = subprocess.run([_tool("nm"), "-C", *flags, path], check=True, capture_output=True,
                         text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            rows.append((parts[2], parts[1]))
        elif len(parts) == 2:  # undefined: no address
            rows.append((parts[1], parts[0]))
    return rows


def defined_runtime_symbols(path):
    """CUDA runtime symbols the module defines itself (should be none)."""
    found = set()
    for flags in (("--defined-only",), ("-D", "--defined-only")):
        try:
            rows = _symbols(path, *flags)
        except subprocess.CalledProcessError:  # stripped: no full table
            continue
        for name, _ in rows:
            bare = name.split("@")[0]
            if RUNTIME_SYMBOL.match(bare) or bare.startswith("cudart::"):
                found.add(bare)
    return sorted(found)


# Defined only inside libstdc++ itself (mangled): std::locale::classic(),
# std::ios_base::Init::Init() and std::ostream::_M_insert<long>. A module that
# defines one carries a static libstdc++ next to the shared one torch loads;
# on the GPU machine such a module crashed in init_process_group, inside its
# own copy of ostream << long.
LIBSTDCXX_ONLY = {"_ZNSt6locale7classicEv", "_ZNSt8ios_base4InitC1Ev", "_ZNSo9_M_insertIlEERSoT_"}


def defined_libstdcxx_symbols(path):
    found = set()
    for flags in (("--defined-only",), ("-D", "--defined-only")):
        try:
            out = subprocess.run([_tool("nm"), *flags, path], check=True, capture_output=True,
                                 text=True).stdout
        except subprocess.CalledProcessError:  # stripped: no full table
            continue
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[-1].split("@")[0] in LIBSTDCXX_ONLY:
                found.add(parts[-1].split("@")[0])
    return sorted(found)


def needed_libraries(path):
    out = subprocess.run([_tool("readelf"), "-d", path], check=True, capture_output=True,
                         text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.fixture(scope="module")
def modules():
    found = _modules()
    if not found:
        pytest.skip(f"no built extension modules in {MODULE_DIR} (run scripts/build.sh)")
    return found


def test_modules_do_not_define_the_cuda_runtime(modules):
    bad = {os.path.basename(m): defined_runtime_symbols(m) for m in modules}
    bad = {m: syms for m, syms in bad.items() if syms}
    assert not bad, ("modules carry their own CUDA runtime (link the shared one: "
                     f"CUDA_RUNTIME_LIBRARY Shared): {({m: s[:5] for m, s in bad.items()})}")


def test_modules_do_not_carry_their_own_libstdcxx(modules):
    bad = {os.path.basename(m): defined_libstdcxx_symbols(m) for m in modules}
    bad = {m: syms for m, syms in bad.items() if syms}
    assert not bad, ("modules carry a static libstdc++ (nvcc's host compiler or the linker "
                     f"links it in; see cmake/Options.cmake): {bad}")
    for m in modules:
        assert any(lib.startswith("libstdc++.so") for lib in needed_libraries(m)), m


def test_cuda_modules_need_the_shared_runtime(modules):
    for m in modules:
        undefined = [n.split("@")[0] for n, t in _symbols(m, "-D", "--undefined-only")]
        if not any(RUNTIME_SYMBOL.match(n) for n in undefined):
            continue  # a build without CUDA
        needed = needed_libraries(m)
        assert any(lib.startswith("libcudart.so") for lib in needed), (os.path.basename(m), needed)


def test_pg_module_links_the_device_collectives(modules):
    # The kernels' host entry points are in the pg module of a CUDA build, and
    # their launches go through the shared runtime (undefined here).
    pg = [m for m in modules if os.path.basename(m).startswith("pg_")]
    if not pg:
        pytest.skip("no pg module built")
    names = {n for n, _ in _symbols(pg[0], "--defined-only")}
    if not any("mooncake::pg::CudaExecutor" in n for n in names):
        pytest.skip("pg module built without CUDA (no CudaExecutor): no device collectives")
    assert any("mooncake::pg::device::allReduce(" in n for n in names), \
        "device allReduce is not linked into the pg module"
    undefined = {n.split("@")[0] for n, _ in _symbols(pg[0], "-D", "--undefined-only")}
    assert undefined & {"cudaLaunchKernel", "__cudaLaunchKernel"}, sorted(
        n for n in undefined if "cuda" in n)[:20]


def test_import_torch_then_pg_in_a_fresh_process():
    code = "import torch\nfrom mooncake import pg\nprint('ok', pg.__name__)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stdout, r.stderr[-2000:])
