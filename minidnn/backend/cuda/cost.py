"""The planner's cost model on the CUDA backend: cuDNN's algorithms with the times Find measured.

It wraps the cost model the trainer would use anyway (a device profile or the
executor's measured step times) and answers for convolutions from cuDNN:
which algorithms a step may use (:meth:`algorithms`, called by the planner in
place of ``op.algorithms``) and how long each takes. Transposed convolutions
run cuDNN's heuristic choice within their default workspace: one algorithm,
nothing to trade.
"""
from __future__ import annotations


class DeviceCost:
    def __init__(self, base, backend):
        self.base, self.backend = base, backend

    @staticmethod
    def _is_conv(op):
        return op.name == "conv2d"

    def algorithms(self, op, in_specs, out_specs, pass_):
        if self._is_conv(op):
            return self.backend.conv.algorithms(op, in_specs, out_specs, pass_)
        if op.name == "conv_transpose2d":
            from ...ops.base import Algo
            ws = op.workspace(in_specs, out_specs) if pass_ == "forward" else op.backward_workspace(in_specs, out_specs)
            return [Algo(None, ws)]
        return op.algorithms(in_specs, out_specs, pass_)

    def step_seconds(self, schedule, step, algo=None) -> float:
        n = step.node
        if algo is not None and algo.name is not None and n is not None and self._is_conv(n.op):
            t = self.backend.conv.seconds(n.op, [v.spec for v in n.inputs], [o.spec for o in n.outputs], step.kind,
                                          algo.name)
            if t is not None:
                return t
        return self.base.step_seconds(schedule, step, algo)

    def transfer_seconds(self, nbytes) -> float:
        return self.base.transfer_seconds(nbytes)

    @property
    def copy_overlap(self) -> float:
        return self.base.copy_overlap
