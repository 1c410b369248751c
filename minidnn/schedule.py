"""The schedule: the ordered steps of one iteration over tensors of known size.

Every buffer of a training step is a :class:`Tensor` here, including each
step's workspace, so the memory planner sees all of them. Persistent tensors
(parameters, their gradients, optimizer state, BN statistics) live outside the
arena; everything else is placed in it by the planner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .graph import Spec

# categories of tensors, as the memory accounting and traces name them
PARAM, PARAM_GRAD, OPT_STATE, STATE = "parameter", "gradient", "optimizer_state", "bn_state"
INPUT, ACT, ACT_GRAD, WORKSPACE = "input", "activation", "activation_gradient", "workspace"
PERSISTENT = (PARAM, PARAM_GRAD, OPT_STATE, STATE)

ALIGN = 64  # every buffer starts on a 64-byte boundary (cache line; CUDA needs >= 16)


def aligned(n: int) -> int:
    return (int(n) + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Tensor:
    id: int
    name: str
    spec: Spec
    category: str
    value: object = None          # the graph Value it holds (or whose gradient it holds)
    slot: str = None              # which optimizer state of the parameter, for OPT_STATE

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    @property
    def persistent(self) -> bool:
        return self.category in PERSISTENT


@dataclass
class Step:
    """One unit of work. ``reads``/``writes`` are tensor ids; ``updates`` are read-modify-written."""

    index: int
    kind: str                     # "load", "forward", "backward", "accumulate", "update"
    label: str
    node: object = None
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    updates: list = field(default_factory=list)
    ws: int = None                # tensor id of the step's scratch buffer, if any
    algo: str = None              # the op's algorithm for this step (None: its default)
    accumulate: tuple = ()        # backward: inputs whose gradient buffer is added into, not overwritten
    # how the executor hands buffers to the op (tensor ids or None), set by autograd
    ins: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    gouts: list = field(default_factory=list)
    gins: list = field(default_factory=list)
    flops: float = 0.0

    @property
    def touched(self):
        return self.reads + self.writes + self.updates + ([self.ws] if self.ws is not None else [])


@dataclass
class Schedule:
    tensors: list
    steps: list
    graph: object
    loss: int = None              # tensor id of the scalar loss (None for inference)
    outputs: list = field(default_factory=list)
    inputs: list = field(default_factory=list)    # tensor ids loaded by the "load" step
    param_grads: dict = field(default_factory=dict)  # param tensor id -> grad tensor id

    def tensor(self, tid) -> Tensor:
        return self.tensors[tid]

    @property
    def arena_tensors(self):
        return [t for t in self.tensors if not t.persistent]

    @cached_property
    def persistent_bytes(self) -> int:
        """Bytes of the persistent region (the tensor list is complete once the schedule is built)."""
        return sum(aligned(t.nbytes) for t in self.tensors if t.persistent)

    @cached_property
    def step_bytes(self) -> list:
        """Bytes each step reads, writes or updates (each tensor once), by step index."""
        nbytes = [t.nbytes for t in self.tensors]
        return [sum(nbytes[t] for t in dict.fromkeys(s.reads + s.writes + s.updates)) for s in self.steps]

    @cached_property
    def tensor_bytes(self) -> np.ndarray:
        """Aligned bytes of each tensor's buffer, by tensor id (int64; read-only)."""
        out = np.fromiter((aligned(t.nbytes) for t in self.tensors), np.int64, len(self.tensors))
        out.flags.writeable = False
        return out

    @cached_property
    def arena_bytes_no_reuse(self) -> int:
        """Every arena tensor in a buffer of its own: the arena of the "ideal" figure."""
        return sum(aligned(t.nbytes) for t in self.tensors if not t.persistent)
