"""Device profiles for planning and simulation without the device.

Figures are the vendors' published peaks (FP32 without tensor cores, memory
bandwidth, host link per direction); ``efficiency`` is the fraction of peak
compute a well-tuned convolution reaches, and ``link_efficiency`` the fraction
of the link's bandwidth a pinned-memory copy reaches (about 0.8 on PCIe).
``copy_overlap`` is the fraction of a copy's time that compute running beside
it does not lose: 1 for a GPU's copy engine; on a CPU the copy thread takes a
core and memory bandwidth from the kernels (the profiling pass measures it).

Data-parallel ranks add links: an :class:`Interconnect` (bandwidth, latency,
and whether it shares the host link that offloads use) prices a ring
all-reduce, and a :class:`SystemProfile` is several devices of one profile on
such links (one node, or nodes joined by a network). Each figure names its
published source.
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
    DeviceProfile("p100-16gb", "Tesla P100 16 GB PCIe, PCIe 3.0 x16 (Horovod's Pascal GPUs)", 16 * 2**30, 9.3e12,
                  732 * GB, 16 * GB * 0.75),
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


@dataclass(frozen=True)
class Interconnect:
    """A link between the devices of data-parallel ranks, as a ring all-reduce sees it.

    ``bandwidth`` is the published figure per direction, ``efficiency`` the fraction of it a
    ring all-reduce reaches (its *bus bandwidth*), ``latency`` the time of one ring step beyond
    its bytes. ``shares_host_link``: the reduction's traffic crosses the same PCIe link as the
    device's offloads and prefetches, so the two contend for it (see ``memory.simulator``).
    """

    name: str
    description: str
    bandwidth: float           # bytes/s, one direction
    latency: float             # seconds per ring step
    shares_host_link: bool
    efficiency: float = 0.8

    def allreduce_seconds(self, nbytes: int, ranks: int) -> float:
        """A ring all-reduce of ``nbytes`` over ``ranks``: a reduce-scatter then an all-gather,
        2(p - 1) steps each moving n/p bytes per rank in both directions at once, so

            t = 2(p - 1)/p * n / (bandwidth * efficiency) + 2(p - 1) * latency

        (NCCL's ring model, src/graph/tuning.cc, less its fixed per-call base latency). 0 for one rank."""
        p = int(ranks)
        if p <= 1:
            return 0.0
        return 2 * (p - 1) / p * nbytes / (self.bandwidth * self.efficiency) + 2 * (p - 1) * self.latency


# Ring step latencies are NCCL's own hardware latencies for a ring with the Simple protocol (the one
# it picks for buckets of megabytes): NVLink 3.4 us, PCI 5.7 us, network 9.6 us (src/graph/tuning.cc, hwLat).
LINKS = {link.name: link for link in [
    # PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b = 15.75 GB/s per direction (PCI-SIG); the V100 profile's
    # host link figure (12 GB/s) and link efficiency (0.8), since peer traffic crosses the same x16 link
    Interconnect("pcie3", "PCIe 3.0 x16 peer-to-peer (through the host link)", 16 * GB * 0.75, 5.7e-6,
                 shares_host_link=True),
    # NVLink 3 on A100 SXM4: 12 links x 25 GB/s = 300 GB/s per direction (NVIDIA A100 datasheet, "600 GB/s"
    # bidirectional); NCCL caps its A100 bus bandwidth model at 235 GB/s (tuning.cc), 0.78 of it
    Interconnect("nvlink3", "NVLink 3 (A100 SXM4, NVSwitch)", 300 * GB, 3.4e-6, shares_host_link=False,
                 efficiency=235 / 300),
    # 100 Gb/s (InfiniBand EDR or 100 GbE RoCE) = 12.5 GB/s per direction; the NIC sits on the GPUs'
    # PCIe switch (GPUDirect RDMA), so its traffic shares the GPU's x16 link with offloads
    # 25 Gb/s RoCE = 3.125 GB/s per direction: Horovod's cluster (Sergeev & Del Balso 2018)
    Interconnect("net25g", "25 Gb/s RoCE, one NIC per node", 3.125 * GB, 9.6e-6, shares_host_link=True),
    Interconnect("net100g", "100 Gb/s network (InfiniBand EDR / RoCE), one NIC per node", 12.5 * GB, 9.6e-6,
                 shares_host_link=True),
]}


@dataclass(frozen=True)
class SystemProfile:
    """Several devices of one profile: ``per_node`` to a node joined by ``intra``, nodes by ``inter``.

    A flat ring over ranks on more than one node crosses the network, so every ring step runs at
    the slower link's pace: :meth:`link` is ``inter`` then (one NIC per node carries the ring).
    """

    name: str
    description: str
    device: DeviceProfile
    per_node: int
    intra: Interconnect
    inter: Interconnect = None
    nodes: int = 1

    @property
    def max_ranks(self) -> int:
        return self.per_node * self.nodes

    def link(self, ranks: int) -> Interconnect:
        """The link that paces a ring over ``ranks`` (ValueError beyond the system's devices)."""
        if not 1 <= ranks <= self.max_ranks:
            raise ValueError(f"profile {self.name!r} has {self.max_ranks} devices; cannot run {ranks} ranks")
        if ranks <= self.per_node:
            return self.intra
        return min((self.intra, self.inter), key=lambda k: k.bandwidth * k.efficiency)


SYSTEMS = {s.name: s for s in [
    SystemProfile("v100-pcie3", "up to 8x Tesla V100 16 GB PCIe on PCIe 3.0 switches (moDNN's era: 2 and 4)",
                  PROFILES["v100-16gb"], 8, LINKS["pcie3"]),
    # the A100 SXM4 40 GB has the PCIe card's FP32 peak, memory bandwidth and PCIe 4.0 host link
    SystemProfile("a100-nvlink", "8x A100 40 GB SXM4 on NVLink 3 / NVSwitch (a DGX A100)",
                  PROFILES["a100-40gb"], 8, LINKS["nvlink3"]),
    SystemProfile("a100-2x8-100g", "2 nodes x 8 A100 40 GB on NVLink 3, nodes over 100 Gb/s",
                  PROFILES["a100-40gb"], 8, LINKS["nvlink3"], LINKS["net100g"], nodes=2),
    # Horovod's anchor: "128 servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s network"
    SystemProfile("p100-128x4-25g", "128 nodes x 4 P100 on PCIe 3.0, nodes over 25 Gb/s RoCE (Horovod's)",
                  PROFILES["p100-16gb"], 4, LINKS["pcie3"], LINKS["net25g"], nodes=128),
]}


def get_system(name) -> SystemProfile:
    """A :class:`SystemProfile` by name; a device profile (or its name) is one device of it, no link."""
    if isinstance(name, SystemProfile):
        return name
    if name in SYSTEMS:
        return SYSTEMS[name]
    try:
        device = get_profile(name)
    except ValueError:
        raise ValueError(f"unknown profile {name!r}; systems: {', '.join(SYSTEMS)}; devices: "
                         f"{', '.join(PROFILES)}") from None
    return SystemProfile(device.name, device.description, device, 1, None)
