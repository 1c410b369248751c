"""Every raw CUDA kernel of the cuda backend compiles with NVRTC, for sm_80 and sm_90, in float and
double (and both index types of the reductions): a kernel that does not compile fails here, on a
machine without a GPU, not in the first minutes of a GPU run.

NVRTC is the ``nvidia-cuda-nvrtc`` wheel (the ``cuda`` extra) or a CUDA toolkit's library, loaded
with ctypes: neither CuPy nor a GPU is needed. Without NVRTC the tests skip.
"""
import ctypes
import glob
import importlib.util
import os

import pytest

from minidnn.backend.cuda.kernel_sources import INDEX_TYPES, SOURCES


def _nvrtc_candidates():
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else None) or []:
        # cu13 wheels put every library in nvidia/cu13/lib; cu12 ones in nvidia/cuda_nvrtc/lib
        yield from sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")), reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            yield from sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")), reverse=True)


def _load_nvrtc():
    for path in _nvrtc_candidates():
        if "builtins" in os.path.basename(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            lib.nvrtcVersion
            return lib, path
        except (OSError, AttributeError):
            continue
    return None, None


NVRTC, NVRTC_PATH = _load_nvrtc()
needs_nvrtc = pytest.mark.skipif(NVRTC is None, reason="NVRTC is not available (pip install nvidia-cuda-nvrtc)")


def compile_cuda(source: str, arch: str):
    """(ok, log) of compiling ``source`` for ``arch`` (e.g. "sm_90") with NVRTC."""
    prog = ctypes.c_void_p()
    rc = NVRTC.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"minidnn.cu", 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram returned {rc}"
    try:
        opts = [b"--std=c++14", f"--gpu-architecture={arch}".encode()]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = NVRTC.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        NVRTC.nvrtcGetProgramLog(prog, log)
        return rc == 0, log.value.decode(errors="replace")
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))


@needs_nvrtc
def test_nvrtc_reports_a_kernel_that_does_not_compile():
    ok, log = compile_cuda('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }', "sm_90")
    assert not ok and "undefined_name" in log


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("ctype", ["float", "double"])
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_raw_kernel_compiles(name, ctype, arch):
    for index in INDEX_TYPES:
        ok, log = compile_cuda(f"typedef {ctype} T;\ntypedef {index} I;\n" + SOURCES[name], arch)
        assert ok, f"{name} (T={ctype}, I={index}, {arch}) does not compile with {NVRTC_PATH}:\n{log}"
