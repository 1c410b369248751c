"""Step times for the planner and the simulator: from a device profile, or measured.

A cost model answers three questions: how long a step of the schedule
computes, how long a copy of n bytes between device and host takes, and what
fraction of a copy's time compute running beside it keeps (``copy_overlap``).
``ProfileCost`` derives both from a :class:`DeviceProfile` (no kernel runs) in
a math precision (the profile's own, or one given: ``memory.profiles.PRECISIONS``);
``MeasuredCost`` takes per-step times measured on the running backend (by the
executor's profiling pass) and the copy bandwidth measured there.
"""
from __future__ import annotations

import numpy as np

from .profiles import ELEMENT_BYTES, PRECISIONS, get_profile

# the ops whose arithmetic runs on tensor cores (convolutions and GEMMs); every other op is
# bound by its bytes
TENSOR_OPS = frozenset({"conv2d", "conv_transpose2d", "linear"})


def _bytes_touched(schedule, step) -> int:
    if step.index < len(schedule.steps) and schedule.steps[step.index] is step:
        return schedule.step_bytes[step.index]        # computed once per schedule
    return sum(schedule.tensors[t].nbytes for t in dict.fromkeys(step.reads + step.writes + step.updates)
               if t < len(schedule.tensors))


def _bytes_at(schedule, step, element_bytes) -> int:
    """The bytes ``step`` touches with every floating-point tensor wider than ``element_bytes``
    counted at that width (an FP32 schedule run as autocast runs it: 2-byte activations)."""
    total = 0
    for t in dict.fromkeys(step.reads + step.writes + step.updates):
        if t >= len(schedule.tensors):
            continue
        spec = schedule.tensors[t].spec
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.floating) and dtype.itemsize > element_bytes:
            total += spec.nbytes // dtype.itemsize * element_bytes
        else:
            total += spec.nbytes
    return total


class ProfileCost:
    """Step times from a device profile in ``precision`` (default: the profile's own): convolutions
    and GEMMs at the precision's tensor-core rate, the rest at the bandwidth over the bytes at the
    precision's element size; the optimizer's update in FP32 (master weights, as autocast)."""

    def __init__(self, profile, precision=None):
        # "measured" without measurements (a schedule other than the one profiled): the CPU profile
        self.profile = get_profile("cpu-2core" if profile == "measured" else profile)
        self.precision = self.profile.precision if precision is None else precision
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; known: {', '.join(PRECISIONS)}")

    def step_seconds(self, schedule, step, algo=None) -> float:
        """Predicted time of ``step``; with ``algo`` (an ops.base.Algo), scaled by its speed hint."""
        if step.kind == "load":
            return self.transfer_seconds(_bytes_touched(schedule, step))
        if step.kind == "update":
            flops = 4.0 * schedule.tensors[step.ins[0]].spec.nbytes / 4
            t = self.profile.compute_seconds(flops, _bytes_touched(schedule, step), precision="fp32")
        else:
            element = ELEMENT_BYTES[self.precision]
            nbytes = _bytes_touched(schedule, step) if element == 4 else _bytes_at(schedule, step, element)
            tensor_op = step.node is not None and step.node.op.name in TENSOR_OPS
            t = self.profile.compute_seconds(step.flops, nbytes, tensor_op, self.precision)
        return t * algo.speed if algo is not None else t

    def transfer_seconds(self, nbytes) -> float:
        return self.profile.transfer_seconds(nbytes)

    def algorithms(self, op, in_specs, out_specs, pass_) -> list:
        """``op``'s algorithms on the profile's device: a GPU's kernels read and write the low dtypes
        of mixed precision; the host CPU's (the CPU backend's) stage them through fp32 (ops.staging)."""
        if self.profile.host:
            return op.algorithms(in_specs, out_specs, pass_)
        return op.native_algorithms(in_specs, out_specs, pass_)

    @property
    def copy_overlap(self) -> float:
        return self.profile.copy_overlap


class MeasuredCost:
    """Times measured on the backend: ``seconds[i]`` for schedule step i, copies at ``bandwidth`` B/s,
    of which compute beside them loses ``1 - copy_overlap``."""

    def __init__(self, seconds, bandwidth, latency=20e-6, algo_seconds=None, copy_overlap=1.0):
        self.seconds, self.bandwidth, self.latency = list(seconds), bandwidth, latency
        self.copy_overlap = copy_overlap
        self.algo_seconds = algo_seconds or {}     # (step index, algorithm name) -> seconds

    def step_seconds(self, schedule, step, algo=None) -> float:
        if algo is None:
            return self.seconds[step.index]
        return self.algo_seconds.get((step.index, algo.name), self.seconds[step.index] * algo.speed)

    def transfer_seconds(self, nbytes) -> float:
        return nbytes / self.bandwidth + self.latency


class CachedCost:
    """A cost model's step times for one schedule, each computed once: the planner asks for
    the same step's time in every candidate plan it builds and simulates. Asked about another
    schedule, it starts again for that one (steps are known by their index alone)."""

    def __init__(self, cost):
        self.cost = cost
        self._schedule = None  # the schedule whose times it holds
        self._seconds = {}     # algorithm -> step index -> seconds (no key tuple per step: fewer objects)

    def step_seconds(self, schedule, step, algo=None) -> float:
        if schedule is not self._schedule:
            self._schedule, self._seconds = schedule, {}
        by_step = self._seconds.get(algo)
        if by_step is None:
            by_step = self._seconds[algo] = {}
        t = by_step.get(step.index)
        if t is None:
            t = by_step[step.index] = self.cost.step_seconds(schedule, step, algo)
        return t

    def transfer_seconds(self, nbytes) -> float:
        return self.cost.transfer_seconds(nbytes)

    def __getattr__(self, name):           # the wrapped model's other attributes (profile, seconds)
        if name == "cost":
            raise AttributeError(name)
        return getattr(self.cost, name)
