"""What this machine offers the CUDA backend, and why not: CuPy, a GPU, the cuDNN binding.

``minidnn._cudnn`` is linked against libcudnn (see ext/cudnn/CMakeLists.txt);
before importing it, the library of the nvidia-cudnn wheel is loaded
(``RTLD_GLOBAL``), so the binding works wherever pip put the wheel. Nothing
here is cached at module level: each call looks again.
"""
from __future__ import annotations

import ctypes
import glob
import importlib
import importlib.util
import os
from dataclasses import dataclass, field

from ...errors import BackendUnavailable


@dataclass
class CudaStatus:
    """One look at the machine; ``problems`` is empty when the cuda backend can run."""

    cupy_version: str = None
    devices: list = field(default_factory=list)       # "name (compute capability, memory)" per GPU
    binding: str = None                               # path of minidnn._cudnn when it imports
    cudnn_version: int = None                         # of the loaded library
    cudnn_header_version: int = None                  # the binding was built against
    problems: list = field(default_factory=list)

    @property
    def available(self) -> bool:
        return not self.problems

    def lines(self) -> list:
        """What ``minidnn info`` prints about CUDA."""
        out = [f"cuda backend: {'available' if self.available else 'not available'}"]
        out += [f"  problem: {p}" for p in self.problems]
        out.append(f"  cupy: {self.cupy_version or 'not installed'}")
        out.append("  GPUs: " + ("; ".join(self.devices) if self.devices else "none"))
        if self.binding:
            out.append(f"  cuDNN binding: {self.binding} (built against cuDNN {_ver(self.cudnn_header_version)})")
            out.append(f"  cuDNN library: {_ver(self.cudnn_version)}")
        else:
            out.append("  cuDNN binding: not available")
        return out


def _ver(v):
    if not v:
        return "?"
    major, minor, patch = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
    return f"{major}.{minor}.{patch}"


def cudnn_wheel_library():
    """libcudnn.so.* of the nvidia-cudnn wheel, or None."""
    spec = importlib.util.find_spec("nvidia.cudnn") if importlib.util.find_spec("nvidia") else None
    for d in (spec.submodule_search_locations if spec else None) or []:
        libs = sorted(glob.glob(os.path.join(d, "lib", "libcudnn.so.*")))
        if libs:
            return libs[0]
    return None


def load_binding():
    """Import minidnn._cudnn (after preloading the wheel's libcudnn); ImportError says why not."""
    lib = cudnn_wheel_library()
    if lib:
        try:
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise ImportError(f"cannot load {lib}: {e}") from e
    try:
        return importlib.import_module("minidnn._cudnn")
    except ImportError as e:
        if "No module named" in str(e):
            raise ImportError("minidnn._cudnn was not built (cudnn.h or the CUDA headers were not found when "
                              "minidnn was installed; pip install 'minidnn[cuda]' and reinstall minidnn)") from e
        raise ImportError(f"minidnn._cudnn does not load: {e} (pip install nvidia-cudnn-cu13)") from e


def status() -> CudaStatus:
    s = CudaStatus()
    try:
        cupy = importlib.import_module("cupy")
        s.cupy_version = cupy.__version__
    except Exception as e:   # a broken CUDA install raises more than ImportError
        cupy = None
        s.problems.append(f"cupy does not import ({type(e).__name__}: {' '.join(str(e).split())[:160]}); "
                          f"pip install 'minidnn[cuda]'")
    if cupy is not None:
        try:
            for i in range(cupy.cuda.runtime.getDeviceCount()):
                p = cupy.cuda.runtime.getDeviceProperties(i)
                name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
                s.devices.append(f"{name} (sm_{p['major']}{p['minor']}, {p['totalGlobalMem'] / 2**30:.1f} GiB)")
            if not s.devices:
                s.problems.append("no CUDA GPU is visible")
        except Exception as e:
            s.problems.append(f"no usable CUDA GPU ({' '.join(str(e).split())[:160]})")
    try:
        b = load_binding()
        s.binding = b.__file__
        s.cudnn_header_version = b.header_version()
        s.cudnn_version = b.version()
    except ImportError as e:
        s.problems.append(str(e))
    return s


def require():
    """Raise BackendUnavailable naming every missing piece, unless the cuda backend can run."""
    s = status()
    if s.problems:
        raise BackendUnavailable("the cuda backend cannot run here: " + "; ".join(s.problems))
    return s
