"""Device profiles for planning and simulation without the device.

Figures are the vendors' published peaks: FP32 on CUDA cores, the tensor cores' dense peaks per
reduced math precision (TF32, FP16, BF16), memory bandwidth, and the host link per direction.
A step's time is the longer of its arithmetic at the rate its op and the profile's ``precision``
get and its bytes at the memory bandwidth (a roofline per step, plus a launch overhead):

- convolutions and GEMMs (the ops tensor cores run) at the tensor peak of the precision, times
  that precision's efficiency; never slower than at FP32 on the CUDA cores (allowing TF32 math
  does not forbid an FP32 kernel: cuDNN and cuBLAS pick the faster). A device without a unit for
  the precision (no TF32 before Ampere, no tensor cores before Volta) runs it at FP32;
- every other op at the FP32 rate, in practice bound by its bytes: ``memory_efficiency`` of the
  bandwidth, the bytes at the precision's element size (2 for FP16/BF16, as autocast stores
  activations; the optimizer's update keeps FP32 master weights).

``efficiency`` is the fraction of the FP32 peak a well-tuned convolution reaches;
``tensor_efficiency`` the fraction of each tensor peak. The profiles of before tensor cores were
priced (Titan X, K40, P100, and the PCIe V100/A100/H100/H200 at FP32) keep ``efficiency`` 0.6
and memory 0.8, so their FP32 predictions, on which the vDNN/moDNN-era comparisons rest, are
unchanged. The SXM profiles (``v100-sxm2-16gb``, ``a100-sxm4-80gb``, ``h100-sxm5-80gb``), the
boards of NVIDIA's published measurements, take the efficiencies fitted to those measurements:
``FP32_FIT`` and ``TENSOR_FIT`` below, fitted once by ``scripts/calibrate_profiles.py``, which
reproduces the fit and prints predicted against published throughput. Every profile's reduced
precisions use ``TENSOR_FIT``.

``link_efficiency`` is the fraction of the link's bandwidth a pinned-memory copy reaches (about
0.8 on PCIe). ``copy_overlap`` is the fraction of a copy's time that compute running beside it
does not lose: 1 for a GPU's copy engine; on a CPU the copy thread takes a core and memory
bandwidth from the kernels (the profiling pass measures it).

Data-parallel ranks add links: an :class:`Interconnect` (bandwidth, latency,
and whether it shares the host link that offloads use) prices a ring
all-reduce, and a :class:`SystemProfile` is several devices of one profile on
such links (one node, or nodes joined by a network). Each figure names its
published source.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GB = 10**9

# the math a step's convolutions and GEMMs run in: FP32 on CUDA cores; TF32 tensor cores on FP32
# data (torch.backends.cuda.matmul.allow_tf32 / cudnn.allow_tf32); FP16 or BF16 data with FP32
# accumulation (autocast), activations at 2 bytes
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class TensorRates:
    """A figure per reduced math precision of convolutions and GEMMs (a peak in FLOP/s, or the
    fraction of it reached); None where the device has no unit for that math."""

    tf32: float = None
    fp16: float = None
    bf16: float = None

    def of(self, precision):
        """The figure of ``precision`` (None for FP32: CUDA cores, the profile's own peak)."""
        return {"fp32": None, "tf32": self.tf32, "fp16": self.fp16, "bf16": self.bf16}[precision]


# The fit (scripts/calibrate_profiles.py reproduces it). Published: NVIDIA DeepLearningExamples,
# PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance results", 1 GPU,
# pytorch-21.03 NGC container: DGX-1 16GB (V100 SXM2 16 GB) 367 img/s FP32, 1200 img/s mixed
# precision; DGX A100 (A100 SXM4 80 GB) 938 img/s TF32, 2470 img/s mixed precision; batch sizes
# from the same folder's configs.yml (resnet50: DGX1V FP32 112, DGX1V AMP 256, DGXA100 TF32 256,
# DGXA100 AMP 256). Predicted: the unlimited-memory training step of minidnn's ResNet-50 (v1.5:
# stride 2 in the 3x3 convolution) at 224x224 with SGD and momentum, on this cost model. The
# memory efficiency is not fitted (0.8, as every profile; the overhead per step is 10 us, as every
# GPU profile): with it free too, no pair meets both mixed figures (wherever V100's 1200 img/s is
# met at a tensor efficiency of at most 1, from a memory efficiency of about 0.65 up, A100 is
# predicted at 2640 img/s or more, rising with it).
# - FP32: solved exactly on V100 SXM2 FP32 at batch 112 (one figure, one unknown): 0.816955,
#   written 0.8170, predicts 367 img/s;
# - TF32: solved exactly on A100 SXM4 TF32 at batch 256: 0.226612, written 0.2266, predicts 938 img/s;
# - FP16: one efficiency for both mixed figures (V100 and A100 at batch 256), least squares of the
#   log ratio predicted/published: 0.512329, written 0.5123, predicts V100 1149 img/s (-4.2%) and
#   A100 2591 img/s (+4.9%);
# - BF16: FP16's (the same tensor-core peak on A100 and H100; the table has no BF16 figure).
FP32_FIT = 0.8170
TENSOR_FIT = TensorRates(tf32=0.2266, fp16=0.5123, bf16=0.5123)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    memory_bytes: int
    peak_flops: float          # FLOP/s, FP32 on CUDA cores
    memory_bandwidth: float    # bytes/s, device memory
    link_bandwidth: float      # bytes/s, host <-> device, one direction
    efficiency: float = 0.6
    link_efficiency: float = 0.8
    step_overhead: float = 10e-6   # seconds per kernel launch and bookkeeping
    copy_overlap: float = 1.0      # fraction of a copy's time that compute does not lose (1: a DMA engine)
    tensor_peaks: TensorRates = TensorRates()   # FLOP/s, dense (no 2:4 sparsity), per reduced precision
    tensor_efficiency: TensorRates = TENSOR_FIT  # fraction of each tensor peak a training step reaches
    memory_efficiency: float = 0.8              # fraction of memory bandwidth a bandwidth-bound op reaches
    precision: str = "fp32"        # the math convolutions and GEMMs run in (PRECISIONS)
    host: bool = False             # the CPU the CPU backend runs on: mixed precision staged through fp32 kernels

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; known: {', '.join(PRECISIONS)}")

    def at_precision(self, precision) -> "DeviceProfile":
        """This device with its steps timed in ``precision`` (one of PRECISIONS)."""
        return self if precision == self.precision else dataclasses.replace(self, precision=precision)

    def compute_seconds(self, flops: float, bytes_moved: float, tensor_op: bool = False, precision=None) -> float:
        """A step of ``flops`` touching ``bytes_moved`` (counted at the precision's element size):
        on tensor cores where ``tensor_op`` (a convolution or GEMM) and the device has them for
        ``precision`` (default: the profile's), else at the FP32 rate."""
        rate = self.peak_flops * self.efficiency
        if tensor_op:
            p = self.precision if precision is None else precision
            peak = self.tensor_peaks.of(p)
            if peak is not None:
                rate = max(rate, peak * self.tensor_efficiency.of(p))
        return max(flops / rate, bytes_moved / (self.memory_bandwidth * self.memory_efficiency)) \
            + self.step_overhead

    def transfer_seconds(self, nbytes: int) -> float:
        return nbytes / (self.link_bandwidth * self.link_efficiency) + 10e-6


PROFILES = {p.name: p for p in [
    DeviceProfile("titanx-12gb", "GTX Titan X (Maxwell) 12 GB, PCIe 3.0 x16 - the vDNN/moDNN era",
                  12 * 2**30, 6.1e12, 336 * GB, 16 * GB * 0.75),
    DeviceProfile("k40-12gb", "Tesla K40 12 GB, PCIe 3.0 x16", 12 * 2**30, 4.3e12, 288 * GB, 16 * GB * 0.75),
    # FP16 at 18.7 TFLOPS (2x FP32, Tesla P100 PCIe datasheet) is FP16 arithmetic, not tensor cores; with
    # the FP32 accumulation mixed precision trains with, convolutions run at the FP32 rate
    DeviceProfile("p100-16gb", "Tesla P100 16 GB PCIe, PCIe 3.0 x16 (Horovod's Pascal GPUs)", 16 * 2**30, 9.3e12,
                  732 * GB, 16 * GB * 0.75),
    # Tesla V100 datasheet, "V100 for PCIe": 14 TFLOPS single precision, 112 TFLOPS tensor (FP16 in, FP32
    # accumulate; no TF32, no BF16), 900 GB/s
    DeviceProfile("v100-16gb", "Tesla V100 16 GB PCIe, PCIe 3.0 x16", 16 * 2**30, 14.0e12, 900 * GB, 16 * GB * 0.75,
                  tensor_peaks=TensorRates(fp16=112e12)),
    # NVIDIA A100 datasheet, "A100 40GB PCIe": FP32 19.5 TFLOPS, TF32 tensor 156, BF16/FP16 tensor 312
    # (dense; 312/624 with sparsity), 1,555 GB/s
    DeviceProfile("a100-40gb", "A100 40 GB PCIe, PCIe 4.0 x16", 40 * 2**30, 19.5e12, 1555 * GB, 32 * GB * 0.75,
                  tensor_peaks=TensorRates(tf32=156e12, fp16=312e12, bf16=312e12)),
    # NVIDIA H100 datasheet, "H100 PCIe": FP32 51 TFLOPS; TF32 756, BF16/FP16 1,513 TFLOPS "with sparsity"
    # (dense: half), 2 TB/s
    DeviceProfile("h100-80gb", "H100 80 GB PCIe, PCIe 5.0 x16", 80 * 2**30, 51.0e12, 2000 * GB, 64 * GB * 0.75,
                  tensor_peaks=TensorRates(tf32=378e12, fp16=756.5e12, bf16=756.5e12)),
    # NVIDIA H200 datasheet, "H200 NVL": FP32 60 TFLOPS; TF32 835, BF16/FP16 1,671 TFLOPS "with sparsity"
    # (dense: half), 4.8 TB/s
    DeviceProfile("h200-141gb", "H200 141 GB (NVL), PCIe 5.0 x16", 141 * 2**30, 60.0e12, 4800 * GB, 64 * GB * 0.75,
                  tensor_peaks=TensorRates(tf32=417.5e12, fp16=835.5e12, bf16=835.5e12)),
    DeviceProfile("cpu-2core", "a 2-core x86 CPU (the CPU backend; host store in the same DRAM)",
                  24 * 2**30, 60e9, 10 * GB, 5 * GB, efficiency=0.5, step_overhead=30e-6,
                  copy_overlap=0.5, host=True),
    # The boards of NVIDIA's published training measurements, with the fitted efficiencies (above).
    # Host links as the PCIe profiles': 16, 32, 64 GB/s per direction (PCIe 3.0/4.0/5.0 x16) x 0.75.
    # Tesla V100 datasheet, "V100 for NVLink" (SXM2): 15.7 TFLOPS single precision, 125 TFLOPS tensor,
    # 900 GB/s; a DGX-1's GPUs reach the host through PCIe 3.0 x16 switches
    DeviceProfile("v100-sxm2-16gb", "Tesla V100 16 GB SXM2 (DGX-1), PCIe 3.0 x16", 16 * 2**30, 15.7e12, 900 * GB,
                  16 * GB * 0.75, efficiency=FP32_FIT, tensor_peaks=TensorRates(fp16=125e12)),
    # NVIDIA A100 datasheet, "A100 80GB SXM": FP32 19.5 TFLOPS, TF32 tensor 156, BF16/FP16 tensor 312
    # (dense), 2,039 GB/s, PCIe Gen4 64 GB/s (both directions)
    DeviceProfile("a100-sxm4-80gb", "A100 80 GB SXM4 (DGX A100), PCIe 4.0 x16", 80 * 2**30, 19.5e12, 2039 * GB,
                  32 * GB * 0.75, efficiency=FP32_FIT, tensor_peaks=TensorRates(tf32=156e12, fp16=312e12, bf16=312e12)),
    # NVIDIA H100 datasheet, "H100 SXM": FP32 67 TFLOPS; TF32 989, BF16/FP16 1,979 TFLOPS "with sparsity"
    # (dense: half), 3.35 TB/s, PCIe Gen5 128 GB/s (both directions). No published ResNet-50 figure is
    # fitted here: its prediction is the fit's, carried from V100 and A100
    DeviceProfile("h100-sxm5-80gb", "H100 80 GB SXM5 (DGX H100), PCIe 5.0 x16", 80 * 2**30, 67.0e12, 3350 * GB,
                  64 * GB * 0.75, efficiency=FP32_FIT,
                  tensor_peaks=TensorRates(tf32=494.5e12, fp16=989.5e12, bf16=989.5e12)),
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

    def at_precision(self, precision) -> "SystemProfile":
        """These devices with their steps timed in ``precision`` (DeviceProfile.at_precision)."""
        return dataclasses.replace(self, device=self.device.at_precision(precision))

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
    SystemProfile("a100-sxm4-nvlink", "8x A100 80 GB SXM4 on NVLink 3 / NVSwitch (a DGX A100 80GB)",
                  PROFILES["a100-sxm4-80gb"], 8, LINKS["nvlink3"]),
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
