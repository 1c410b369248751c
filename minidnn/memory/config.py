"""What the user says about memory: a budget and a policy."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .policies import get_policy

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text) -> int:
    """``"12GiB"``, ``"512 MiB"``, ``"1.5GB"`` or an int -> bytes."""
    if isinstance(text, (int,)) and not isinstance(text, bool):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: use bytes or a unit such as '512MiB', '12GiB', '16GB'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_budget(budget):
    """What a budget says, the one reading of it (the API's and the command line's): None (no
    limit), bytes (an int, from ``12884901888``, ``"12GiB"`` or ``"1.5GB"``), or a fraction of the
    liveness peak (a float in (0, 1], from ``0.6``, ``"0.6"`` or ``"60%"``). ValueError otherwise."""
    b = budget
    if b is None:
        return None
    if isinstance(b, str) and b.strip().endswith("%"):
        b = float(b.strip()[:-1]) / 100
    elif isinstance(b, str) and re.fullmatch(r"\s*0?\.[0-9]+\s*|\s*1(\.0*)?\s*", b):
        b = float(b)                      # "0.6" on a command line: a fraction
    if isinstance(b, float):
        if not 0 < b <= 1:
            raise ValueError(f"a fractional budget must be in (0, 1], got {budget!r}")
        return b
    n = parse_bytes(b)
    if n <= 0:
        raise ValueError(f"the budget must be positive, got {budget!r}")
    return n


def format_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


CPU_PROFILE = "cpu-2core"      # MemoryConfig's default profile: the machine the CPU backend runs on

# CUDA device names (as cudaGetDeviceProperties gives them) -> the profile of that GPU, first match wins
_GPU_PROFILES = (("H200", "h200-141gb"), ("H100", "h100-80gb"), ("A100", "a100-40gb"), ("V100", "v100-16gb"),
                 ("P100", "p100-16gb"), ("K40", "k40-12gb"), ("TITAN X", "titanx-12gb"))


def gpu_profile(profile, device_name: str):
    """The profile ``profile`` (a MemoryConfig's) stands for on the CUDA GPU ``device_name``.

    The default, the CPU's profile, means "this machine's": on a GPU, the GPU's profile, so
    that non-convolution steps and copies are timed at a GPU's speed and PCIe bandwidth, not a
    2-core CPU's (convolutions are timed by cuDNN's Find either way). A GPU this table does not
    know gets the H100's, the nearest generation to the ones it lists. A GPU profile or
    ``"measured"`` is kept as given."""
    if profile != CPU_PROFILE:
        return profile
    name = device_name.upper()
    return next((p for key, p in _GPU_PROFILES if key in name), "h100-80gb")


@dataclass
class MemoryConfig:
    """The memory budget and how to meet it.

    ``budget``: ``None`` (no limit), bytes (int), a size string (``"12GiB"``),
    or a fraction of the liveness peak (a float in (0, 1], or ``"60%"``). It
    covers every byte the framework holds on the device: the persistent part
    (parameters, gradients, optimizer state, BN statistics) plus the arena.
    ``poison`` fills every freed region with NaN bytes, to prove nothing reads
    stale memory; ``check`` verifies at run time that no two live buffers overlap.
    ``policy`` chooses how the planner meets the budget (``"auto"``, ``"none"``
    or a policy object); ``profile`` is the device profile the cost model uses
    when no measured times are given (see ``memory.profiles``); on the cuda
    backend the default stands for the GPU's own profile (:func:`gpu_profile`).
    ``algorithms``: ``"auto"`` lets the planner pick each convolution's
    algorithm (fastest first, smaller workspaces under a tight budget);
    ``"default"`` keeps every op's default algorithm. Offload, prefetch and
    recomputation never change a result: a step planned whole (``plan.k == 1``)
    with the unlimited plan's algorithms (``plan.algorithm_changes`` empty) trains
    bitwise identically to unlimited memory. With ``algorithms="default"`` and
    ``sub_batching=False`` that holds under every feasible budget. Under
    ``"auto"``, a smaller-workspace algorithm may change the last bits
    (``plan.algorithm_changes`` lists each).
    With ``sub_batching``, a training step is split into sub-batches whose
    gradients accumulate (see ``memory.subbatch``), and the result then changes
    by float rounding: ``"fastest"`` (the default) where it cannot fit whole, and
    where it fits but evicting is predicted slower than the split and splitting
    keeps the step's meaning, so that a tighter budget is never planned faster
    than a looser one for want of the split; ``True`` only where it cannot fit. ``bn`` says whose statistics a training-mode
    BatchNorm uses in a split step: ``"exact"`` (the default: the full
    mini-batch's, as the unsplit step; the sub-batches run stage by stage
    between BatchNorms, so parameters and running statistics follow the
    unsplit run's up to float rounding, at the cost of keeping each sub-batch's
    BatchNorm inputs until the full statistics are known) or ``"sub-batch"``
    (each sub-batch its own, as moDNN does: another training, on request, named
    in the plan's summary).
    """

    budget: object = None
    policy: object = "auto"
    profile: object = CPU_PROFILE
    algorithms: str = "auto"
    sub_batching: object = "fastest"     # "fastest", True (only where needed) or False
    bn: str = "exact"
    poison: bool = False
    check: bool = False

    def __post_init__(self):
        if self.algorithms not in ("auto", "default"):
            raise ValueError(f"algorithms must be 'auto' or 'default', got {self.algorithms!r}")
        if self.sub_batching not in (True, False, "fastest"):
            raise ValueError(f"sub_batching must be True, False or 'fastest', got {self.sub_batching!r}")
        if self.bn not in ("sub-batch", "exact"):
            raise ValueError(f"bn (BatchNorm statistics when a mini-batch is split) must be 'exact' or "
                             f"'sub-batch', got {self.bn!r}")

    def policy_object(self):
        """The policy as an object (a name is looked up among the known policies)."""
        if not isinstance(self.policy, str):
            return self.policy
        return get_policy(self.policy)

    def resolve(self, liveness_peak: int):
        """The budget in bytes (None for unlimited), given the liveness peak."""
        b = parse_budget(self.budget)
        return int(b * liveness_peak) if isinstance(b, float) else b
