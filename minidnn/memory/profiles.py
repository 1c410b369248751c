"""Device profiles for planning and simulation without the device.

Figures are the vendors' published peaks (FP32 without tensor cores, memory
bandwidth, host link per direction); ``efficiency`` is the fraction of peak
compute a well-tuned convolution reaches, and ``link_efficiency`` the fraction
of the link's bandwidth a pinned-memory copy reaches (about 0.8 on PCIe).
``copy_overlap`` is the fraction of a copy's time that compute running beside
it does not lose: 1 for a GPU's copy engine; on a CPU the copy thread takes a
core and memory bandwidth from the kernels (the profiling pass measures it).
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 10**9


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    memory_bytes: int
    peak_flops: float          # FLOP/s, FP32
    memory_bandwidth: float    # bytes/s, device memory
    link_bandwidth: float      # bytes/s, host <-> device, one direction
    efficiency: float = 0.6
    link_efficiency: float = 0.8
    step_overhead: float = 10e-6   # seconds per kernel launch and bookkeeping
    copy_overlap: float = 1.0      # fraction of a copy's time that compute does not lose (1: a DMA engine)

    def compute_seconds(self, flops: float, bytes_moved: float) -> float:
        return max(flops / (self.peak_flops * self.efficiency), bytes_moved / (self.memory_bandwidth * 0.8)) \
            + self.step_overhead

    def transfer_seconds(self, nbytes: int) -> float:
        return nbytes / (self.link_bandwidth * self.link_efficiency) + 10e-6


PROFILES = {p.name: p for p in [
    DeviceProfile("titanx-12gb", "GTX Titan X (Maxwell) 12 GB, PCIe 3.0 x16 - the vDNN/moDNN era",
                  12 * 2**30, 6.1e12, 336 * GB, 16 * GB * 0.75),
    DeviceProfile("k40-12gb", "Tesla K40 12 GB, PCIe 3.0 x16", 12 * 2**30, 4.3e12, 288 * GB, 16 * GB * 0.75),
    DeviceProfile("v100-16gb", "Tesla V100 16 GB PCIe, PCIe 3.0 x16", 16 * 2**30, 14.0e12, 900 * GB, 16 * GB * 0.75),
    DeviceProfile("a100-40gb", "A100 40 GB PCIe, PCIe 4.0 x16", 40 * 2**30, 19.5e12, 1555 * GB, 32 * GB * 0.75),
    DeviceProfile("h100-80gb", "H100 80 GB PCIe, PCIe 5.0 x16", 80 * 2**30, 51.0e12, 2000 * GB, 64 * GB * 0.75),
    DeviceProfile("h200-141gb", "H200 141 GB (NVL), PCIe 5.0 x16", 141 * 2**30, 60.0e12, 4800 * GB, 64 * GB * 0.75),
    DeviceProfile("cpu-2core", "a 2-core x86 CPU (the CPU backend; host store in the same DRAM)",
                  24 * 2**30, 60e9, 10 * GB, 5 * GB, efficiency=0.5, step_overhead=30e-6,
                  copy_overlap=0.5),
]}


def get_profile(name) -> DeviceProfile:
    if isinstance(name, DeviceProfile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None
