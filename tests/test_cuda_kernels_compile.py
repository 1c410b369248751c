"""Every raw CUDA kernel of the cuda backend compiles with NVRTC, for sm_80 and sm_90, in every data type
it is launched with (float, double, and mixed precision's __half and __nv_bfloat16 with float statistics)
and both index types: a kernel that does not compile fails here, on a machine without a GPU, not in the
first minutes of a GPU run. Each is compiled exactly as ``kernels.py`` compiles it (``prelude`` in front).

NVRTC is the ``nvidia-cuda-nvrtc`` wheel (the ``cuda`` extra) or a CUDA toolkit's library, loaded
with ctypes: neither CuPy nor a GPU is needed. Without NVRTC the tests skip. The 2-byte types need
CUDA's ``cuda_fp16.h`` and ``cuda_bf16.h`` (a toolkit's include folder, or an nvidia wheel's), which CuPy
hands NVRTC on a GPU machine; without them those cases skip, saying so.
"""
import ctypes
import glob
import importlib.util
import os

import pytest

from minidnn.backend.cuda.kernel_sources import DTYPES, INDEX_TYPES, SOURCES, STATS, prelude


def _nvidia_roots():
    spec = importlib.util.find_spec("nvidia")
    return list((spec.submodule_search_locations if spec else None) or [])


def _cuda_homes():
    return [h for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if h]


def _nvrtc_candidates():
    for root in _nvidia_roots():
        # cu13 wheels put every library in nvidia/cu13/lib; cu12 ones in nvidia/cuda_nvrtc/lib
        yield from sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")), reverse=True)
    for home in _cuda_homes():
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


def _half_headers():
    """The include folder holding cuda_fp16.h and cuda_bf16.h (a wheel's or a toolkit's), or None."""
    folders = [os.path.join(r, "*", "include") for r in _nvidia_roots()] + [os.path.join(h, "include")
                                                                              for h in _cuda_homes()]
    for pattern in folders:
        for folder in sorted(glob.glob(pattern)):
            if all(os.path.isfile(os.path.join(folder, h)) for h in ("cuda_fp16.h", "cuda_bf16.h")):
                return folder
    return None


NVRTC, NVRTC_PATH = _load_nvrtc()
HEADERS = _half_headers()
needs_nvrtc = pytest.mark.skipif(NVRTC is None, reason="NVRTC is not available (pip install nvidia-cuda-nvrtc)")


def compile_cuda(source: str, arch: str, include=None):
    """(ok, log) of compiling ``source`` for ``arch`` (e.g. "sm_90") with NVRTC (``include``: a -I folder)."""
    prog = ctypes.c_void_p()
    rc = NVRTC.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"minidnn.cu", 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram returned {rc}"
    try:
        opts = [b"--std=c++14", f"--gpu-architecture={arch}".encode()] + ([f"-I{include}".encode()] if include else [])
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


def test_every_data_type_has_its_statistics_type():
    """2-byte activations keep BatchNorm's statistics in float32 (P = float), as autocast's fp32 statistics."""
    assert set(DTYPES) == {"float32", "float64", "float16", "bfloat16"} == set(STATS)
    for dt, (t, p, a, header) in DTYPES.items():
        assert p == {"float32": "float", "float64": "double"}[STATS[dt]]
        assert (header is None) == (dt in ("float32", "float64")) and (a == "float") == (dt != "float64")
    assert "typedef __nv_bfloat16 T;" in prelude("bfloat16") and "#include <cuda_bf16.h>" in prelude("bfloat16")
    assert "typedef unsigned int I;" in prelude("float16", "unsigned int")


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_raw_kernel_compiles(name, dtype, arch):
    header = DTYPES[dtype][3]
    if header is not None and HEADERS is None:
        pytest.skip(f"{header} is not found (a CUDA toolkit's include folder, CUDA_HOME, or an nvidia wheel's)")
    for index in INDEX_TYPES:
        ok, log = compile_cuda(prelude(dtype, index) + SOURCES[name], arch, HEADERS if header else None)
        assert ok, f"{name} ({dtype}, I={index}, {arch}) does not compile with {NVRTC_PATH}:\n{log}"
        assert "warning" not in log, f"{name} ({dtype}, I={index}, {arch}) warns:\n{log}"

