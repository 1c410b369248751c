"""Dynamic loss scaling for fp16 training, with torch.cuda.amp.GradScaler's rules and defaults.

The loss's gradient is seeded with ``scale`` (the executor's ``ctx.loss_scale``), so every
fp16 gradient is ``scale`` times the true one and small ones do not flush to zero. Before the
first update of a step the fp32 parameter gradients are unscaled (multiplied by ``1 / scale``,
exact for a power of two) and checked: one inf or NaN and the step's updates are all skipped
(and counted), the scale is multiplied by ``backoff_factor``; ``growth_interval`` clean steps
in a row multiply it by ``growth_factor``. The scale, the clean-step count and the skipped-step
count are checkpointed (``state_dict``).

An fp16 forward whose loss is inf or NaN is such a step too (its gradients are the loss's
gradient, inf, times the rest), where fp32 and bf16 raise NumericalError.

Where the scale would fall below ``min_scale`` (every step overflowing: the gradients do not
fit fp16 even unscaled) the step is refused with a NumericalError naming what to do.
"""
from __future__ import annotations

import numpy as np

from .errors import NumericalError


class StepScaling:
    """One step's scale and what its unscaling found (the executor fills ``found_inf``)."""

    def __init__(self, scaler):
        self.scaler = scaler
        self.scale = scaler.scale
        self.found_inf = False
        self.loss_inf = False          # the loss itself was inf/NaN: so is every gradient (its seed times it)
        self.after = None              # the scaler's state after this step, once unscaled

    def nonfinite_loss(self):
        """The forward's loss is inf or NaN: the step is skipped and the scale backed off, as
        GradScaler does when the scaled loss's gradients come out inf (the executor calls this where
        an fp32 or bf16 run raises NumericalError)."""
        self.loss_inf = True

    def unscale(self, xp, grads):
        """Unscale ``grads`` in place (fp32, as GradScaler.unscale_), note whether one is inf or NaN, and
        work out the scaler's next state (NumericalError, before anything is committed, where the scale
        would fall below its minimum)."""
        inv = np.float32(1.0) / np.float32(self.scale)        # GradScaler's inv_scale, in fp32
        finite = True
        for g in grads:
            g *= inv.astype(g.dtype)
            finite = finite and bool(xp.isfinite(g).all())
        self.found_inf = self.agree(self.loss_inf or not finite)
        self.after = self.scaler.after(self)

    def agree(self, found_inf: bool) -> bool:
        """Whether the step is skipped, given what this process found: its own finding here; a
        data-parallel rank takes every rank's (:mod:`minidnn.distributed.scaling`), so that a step
        skipped on one rank is skipped on all."""
        return found_inf


class GradScaler:
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 min_scale=1.0):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("GradScaler: needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 "
                             "and growth_interval >= 1")
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.min_scale = int(growth_interval), float(min_scale)
        self.growth_tracker = 0        # clean steps in a row since the last change of the scale
        self.skipped_steps = 0         # steps whose update was skipped for an inf/NaN gradient
        self.overflows_in_a_row = 0

    def begin(self) -> StepScaling:
        return StepScaling(self)

    def end(self, step: StepScaling):
        """Apply ``step``'s outcome (a step without updates, as evaluation, changes nothing)."""
        if step.after is not None:
            self.load_state_dict(step.after)

    def after(self, step: StepScaling) -> dict:
        """The scaler's state after ``step`` (GradScaler.update's rules), not yet applied: the trainer
        applies it with :meth:`load_state_dict` once the step is committed. NumericalError if the scale
        would fall below ``min_scale``."""
        s = self.state_dict()
        if step.found_inf:
            s["scale"] = self.scale * self.backoff_factor
            s["growth_tracker"] = 0
            s["skipped_steps"] += 1
            s["overflows_in_a_row"] += 1
            if s["scale"] < self.min_scale:
                raise NumericalError(
                    f"fp16 loss scaling: {s['overflows_in_a_row']} steps in a row had inf/NaN gradients and the "
                    f"scale would fall below its minimum {self.min_scale:g}; the gradients overflow fp16 even "
                    f"unscaled: train with precision='bf16' (fp32's range) or a lower learning rate")
        else:
            s["overflows_in_a_row"] = 0
            s["growth_tracker"] += 1
            if s["growth_tracker"] == self.growth_interval:
                s["scale"] = self.scale * self.growth_factor
                s["growth_tracker"] = 0
        return s

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker, "skipped_steps": self.skipped_steps,
                "overflows_in_a_row": self.overflows_in_a_row}

    def load_state_dict(self, d):
        self.scale = float(d["scale"])
        self.growth_tracker = int(d["growth_tracker"])
        self.skipped_steps = int(d["skipped_steps"])
        self.overflows_in_a_row = int(d.get("overflows_in_a_row", 0))
