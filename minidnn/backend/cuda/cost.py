"""The planner's cost model on the CUDA backend: cuDNN's algorithms with the times Find measured.

It wraps the cost model the trainer would use anyway (a device profile or the
executor's measured step times) and answers for convolutions from cuDNN:
which algorithms a step may use (:meth:`algorithms`, called by the planner in
place of ``op.algorithms``) and how long each takes. Transposed convolutions
run cuDNN's heuristic choice within their default workspace: one algorithm,
nothing to trade.

Under mixed precision a convolution reaches the planner either as itself (its
kernels read bf16/fp16: cuDNN's algorithms at the low dtype) or staged through
fp32 (``ops.staging``: cuDNN's fp32 algorithms, each workspace with the staging
buffers added); ``op.staged_algorithms`` tells the two apart, as on the CPU
backend, and :func:`kernel_specs` names the specs its kernels run at.
"""
from __future__ import annotations


def kernel_specs(op, in_specs, out_specs, pass_):
    """(inputs, outputs) as ``op``'s kernels see them: a staged op's (ops.staging) are fp32, an op's own are
    its specs. ``staged_algorithms`` hands the listing exactly these."""
    seen = []
    op.staged_algorithms(lambda ins, outs, p: seen.append((list(ins), list(outs))) or [], in_specs, out_specs,
                         pass_)
    return seen[0]


class DeviceCost:
    def __init__(self, base, backend):
        self.base, self.backend = base, backend

    @staticmethod
    def _is_conv(op):
        return op.name == "conv2d"

    def algorithms(self, op, in_specs, out_specs, pass_):
        if self._is_conv(op):
            return op.staged_algorithms(lambda ins, outs, p: self.backend.conv.algorithms(op, ins, outs, p),
                                        in_specs, out_specs, pass_)
        if op.name == "conv_transpose2d":
            from ...ops.base import Algo
            ws = op.workspace(in_specs, out_specs) if pass_ == "forward" else op.backward_workspace(in_specs, out_specs)
            return [Algo(None, ws)]
        return op.algorithms(in_specs, out_specs, pass_)

    def step_seconds(self, schedule, step, algo=None) -> float:
        n = step.node
        if algo is not None and algo.name is not None and n is not None and self._is_conv(n.op):
            ins, outs = kernel_specs(n.op, [v.spec for v in n.inputs], [o.spec for o in n.outputs], step.kind)
            t = self.backend.conv.seconds(n.op, ins, outs, step.kind, algo.name)
            if t is not None:
                return t
        return self.base.step_seconds(schedule, step, algo)

    def transfer_seconds(self, nbytes) -> float:
        return self.base.transfer_seconds(nbytes)

    @property
    def copy_overlap(self) -> float:
        return self.base.copy_overlap
