"""Optimizers and learning-rate schedules.

An optimizer is a policy object handed to ``minidnn.compile``: it names the
state it keeps per parameter (allocated once in the persistent region) and
updates one parameter in place per ``update`` step, with scratch memory from
the arena. Hyperparameters live on the object, so a schedule changes ``lr``.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ConfigError


def check_range(name, value, low, high=math.inf, high_open=False):
    """``value`` itself if it is a number in [low, high] (or [low, high)); ConfigError naming ``name`` if not."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not (low <= v <= high) or (high_open and v == high) or math.isinf(v):
        upper = "" if math.isinf(high) else f", {high}{')' if high_open else ']'}"
        what = f"in [{low}{upper}" if upper else f">= {low} and finite"
        raise ConfigError(f"{name} must be {what}, got {value}")
    return value


class Optimizer:
    state_names: tuple = ()

    def __init__(self, lr):
        self.lr = check_range("lr", lr, 0.0)
        self.initial_lr = lr
        # The training step after which the per-parameter state began (0, or where a resume reset it):
        # update() counts t from there, so a fresh state gets a first step's initialisation and bias correction.
        self.state_start = 0

    def workspace(self, spec) -> int:
        """Scratch bytes one update of a parameter of ``spec`` needs."""
        return spec.nbytes

    def update(self, p, g, states, ws, t, k=None):
        """Update parameter ``p`` in place from gradient ``g``; ``t`` counts steps from 1; ``k``: the
        backend's kernels, whose fused updates an optimizer may use (None: array operations).
        It allocates nothing (scratch comes from ``ws``), so nothing can fail halfway through a
        step's updates (minidnn.transaction)."""
        raise NotImplementedError

    def state_dict(self):
        return {k: v for k, v in vars(self).items() if isinstance(v, (int, float, bool))}

    def load_state_dict(self, d):
        for k, v in d.items():
            setattr(self, k, v)


def _scratch(ws, p):
    return ws[:p.nbytes].view(p.dtype).reshape(p.shape)


class SGD(Optimizer):
    """SGD with momentum, Nesterov momentum and L2 weight decay (PyTorch's update rule)."""

    def __init__(self, lr=0.01, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(lr)
        check_range("momentum", momentum, 0.0, 1.0)
        check_range("dampening", dampening, 0.0, 1.0)
        check_range("weight_decay", weight_decay, 0.0)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        self.momentum, self.dampening, self.weight_decay, self.nesterov = momentum, dampening, weight_decay, nesterov

    @property
    def state_names(self):
        # from the momentum itself, so a state_dict loaded over it cannot leave them disagreeing unseen
        return ("momentum_buffer",) if self.momentum else ()

    def workspace(self, spec):
        return (2 if self.nesterov else 1) * spec.nbytes

    def update(self, p, g, states, ws, t, k=None):
        t -= self.state_start
        fused = getattr(k, "sgd_update", None)
        if fused is not None:      # the whole rule in one pass over memory, in the same order of operations
            fused(p, g, states[0] if self.momentum else None, self.lr, self.momentum, self.dampening,
                  self.weight_decay, self.nesterov, t == 1)
            return
        # each array op is one pass over memory: the step is formed where it is needed, never copied
        d = _scratch(ws, p)
        dt = p.dtype.type
        grad = g
        if self.weight_decay:
            np.multiply(p, dt(self.weight_decay), out=d)
            d += g
            grad = d
        step = grad
        if self.momentum:
            (buf,) = states
            if t == 1:
                np.copyto(buf, grad)
            else:
                buf *= dt(self.momentum)
                if self.dampening:          # (no Nesterov with dampening: grad is not read again)
                    np.multiply(grad, dt(1 - self.dampening), out=d)
                    buf += d
                else:
                    buf += grad
            step = buf
            if self.nesterov:
                e = ws[p.nbytes:2 * p.nbytes].view(p.dtype).reshape(p.shape)
                np.multiply(buf, dt(self.momentum), out=e)
                np.add(grad, e, out=d)
                step = d
        np.multiply(step, dt(self.lr), out=d)
        p -= d


class Adam(Optimizer):
    """Adam (Kingma & Ba); with ``decoupled`` weight decay it is AdamW."""

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
        super().__init__(lr)
        for i, beta in enumerate(betas):
            check_range(f"betas[{i}]", beta, 0.0, 1.0, high_open=True)
        check_range("eps", eps, 0.0)
        check_range("weight_decay", weight_decay, 0.0)
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay, self.decoupled = eps, weight_decay, decoupled

    def workspace(self, spec):
        return 2 * spec.nbytes

    def update(self, p, g, states, ws, t, k=None):
        t -= self.state_start
        m, v = states
        dt = p.dtype.type
        n = p.nbytes
        a = ws[:n].view(p.dtype).reshape(p.shape)
        b = ws[n:2 * n].view(p.dtype).reshape(p.shape)
        if t == 1:
            m[...] = 0
            v[...] = 0
        if self.weight_decay and self.decoupled:
            p *= dt(1 - self.lr * self.weight_decay)
        if self.weight_decay and not self.decoupled:
            np.multiply(p, dt(self.weight_decay), out=a)
            a += g
        else:
            np.copyto(a, g)
        np.multiply(a, a, out=b)
        a *= dt(1 - self.beta1)
        m *= dt(self.beta1)
        m += a
        v *= dt(self.beta2)
        b *= dt(1 - self.beta2)
        v += b
        bc1 = 1 - self.beta1 ** t
        bc2 = 1 - self.beta2 ** t
        np.divide(v, dt(bc2), out=b)
        np.sqrt(b, out=b)
        b += dt(self.eps)
        np.divide(m, b, out=a)
        a *= dt(self.lr / bc1)
        p -= a


class AdamW(Adam):
    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(lr, betas, eps, weight_decay, decoupled=True)


class LRSchedule:
    """Sets ``optimizer.lr`` per epoch; call ``step()`` once at the end of each epoch."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.epoch = 0

    def lr_at(self, epoch) -> float:
        raise NotImplementedError

    def step(self):
        self.epoch += 1
        self.optimizer.lr = self.lr_at(self.epoch)

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, d):
        self.epoch = d["epoch"]
        self.optimizer.lr = self.lr_at(self.epoch)


class StepLR(LRSchedule):
    def __init__(self, optimizer, step_size, gamma=0.1):
        super().__init__(optimizer)
        self.step_size, self.gamma = step_size, gamma

    def lr_at(self, epoch):
        return self.optimizer.initial_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRSchedule):
    def __init__(self, optimizer, T_max, eta_min=0.0):
        super().__init__(optimizer)
        self.T_max, self.eta_min = T_max, eta_min

    def lr_at(self, epoch):
        e = min(epoch, self.T_max)
        return self.eta_min + (self.optimizer.initial_lr - self.eta_min) * (1 + math.cos(math.pi * e / self.T_max)) / 2
