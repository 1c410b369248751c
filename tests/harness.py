"""A shared forward/backward harness for op tests (Chainer style).

A test describes an op once, as an :class:`OpCase`: a ``build`` function that
applies the op to traced values, the input arrays, and an independent NumPy
``forward_expected``. The harness then checks every case the same way,
through the real pipeline (trace -> autodiff -> plan -> arena executor, with
memory checking and NaN poisoning on):

* the inputs become ``nn.Parameter``s (``nn.Buffer``s for the indices in
  ``state``) of a small :class:`CaseNet`, whose ``forward`` ignores the dummy
  graph input and returns ``build(*inputs)``;
* the loss is ``nn.MSELoss`` against a fixed random target, so
  L = mean((f - t)^2), or ``nn.CrossEntropyLoss`` against ``labels`` when the
  case says ``loss="ce"`` (loss ops must be terminal);
* **forward**: ``trainer.predict`` vs ``forward_expected``, and the loss that
  ``trainer.step`` returns vs the loss of the reference output (float64 and
  float32);
* **backward**: ``p.grad`` after one ``trainer.step`` (no optimizer, so nothing
  moves) vs float64 central differences of that same step's loss, for every
  element of each checked input (a seeded subset of at most ``MAX_PROBES`` for
  larger ones);
* **torch**: forward, loss and every gradient vs ``torch.nn.functional``
  in float64, for cases that give a ``torch`` function.

:func:`op_tests` makes the three checks over a module's cases into its pytest
tests; :func:`run_op` runs one op's forward and backward on given arrays, outside a graph (the
mixed-precision tests compare an op's staged low-precision passes with its fp32 passes that way);
:class:`FnModule` puts an expression under test at a module path of its
own; :func:`step_matches_torch` checks one training step of a whole network
against the same network in PyTorch.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn
from minidnn.graph import as_value

MAX_PROBES = 40        # elements per input probed by central differences
EPS = 1e-6
GRAD_TOL = dict(rtol=1e-6, atol=1e-8)
FWD_TOL = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-5)}
TORCH_TOL = dict(rtol=1e-10, atol=1e-12)
DUMMY = np.zeros((1, 1))   # the graph input every CaseNet ignores


def host(a):
    """A NumPy copy of ``a`` (a device array is copied to the host), for comparisons: later steps
    overwrite the arrays a trainer exposes (gradients, parameters) in place."""
    return a.get() if hasattr(a, "get") and not isinstance(a, (np.ndarray, dict)) else np.array(a)


def rng_for(*key) -> np.random.Generator:
    """A generator seeded from ``key``, stable across runs and processes."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@dataclass
class OpCase:
    name: str
    build: Callable                        # (*traced inputs) -> traced output
    inputs: Sequence[np.ndarray]
    forward_expected: Callable             # (*arrays) -> array, plain NumPy
    grad: Optional[Sequence[int]] = None   # inputs to grad-check; None: all but `state`
    state: Sequence[int] = ()              # inputs passed as Buffers (never differentiated)
    torch: Optional[Callable] = None       # (F, *tensors) -> tensor, torch.nn.functional form
    loss: str = "mse"                      # "mse" (random target) or "ce" (against `labels`)
    labels: Optional[np.ndarray] = None
    bugs: dict = field(default_factory=dict)  # check ("forward", "backward", "torch", "all") -> xfail mark

    @property
    def checked(self):
        return [i for i in range(len(self.inputs)) if i not in self.state] if self.grad is None else list(self.grad)

    def param(self, check):
        """This case as a pytest param of the test running ``check``, xfail'ed where a bug is known."""
        marks = [m for k, m in self.bugs.items() if k in (check, "all")]
        return pytest.param(self, id=self.name, marks=marks)

    def target(self):
        """Labels for ``loss="ce"``, otherwise a fixed random target shaped like the output."""
        if self.loss == "ce":
            return np.asarray(self.labels, np.int64)
        shape = np.shape(self.forward_expected(*self.inputs))
        return rng_for(self.name, "target").standard_normal(shape)


class CaseNet(nn.Module):
    """Holds a case's inputs as parameters/buffers; ``forward`` applies the op to them."""

    def __init__(self, case):
        super().__init__()
        self.case = case
        for i, a in enumerate(case.inputs):
            holder = nn.Buffer(np.array(a)) if i in case.state else nn.Parameter(np.array(a))
            setattr(self, f"in{i}", holder)

    def holders(self):
        return [getattr(self, f"in{i}") for i in range(len(self.case.inputs))]

    def forward(self, x):
        return self.case.build(*[as_value(x.graph, h) for h in self.holders()])


class FnModule(nn.Module):
    """A module whose ``forward`` is ``fn(x)``: an expression under test, at a module path of its own."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def compile_case(case, dtype=np.float64, seed=0, device="cpu"):
    """(trainer, net) for ``case``, with memory checking and NaN poisoning on."""
    net = CaseNet(case)
    loss = nn.CrossEntropyLoss() if case.loss == "ce" else nn.MSELoss()
    trainer = mdn.compile(net, DUMMY.shape, loss, optimizer=None, dtype=dtype, seed=seed, device=device,
                          memory=mdn.MemoryConfig(check=True, poison=True))
    return trainer, net


def reference_loss(case, out, target):
    out = np.asarray(out, np.float64)
    if case.loss == "ce":
        z = out - out.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return -logp[np.arange(len(target)), target].mean()
    return np.mean((out - target) ** 2)


def _close(got, want, what, **tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, err_msg=what, **tol)


# ------------------------------------------------------------------ the checks
def check_forward(case, dtype=np.float64, device="cpu"):
    dtype = np.dtype(dtype).type
    tol = dict(FWD_TOL[dtype])
    expected = np.asarray(case.forward_expected(*case.inputs), np.float64)
    tol["atol"] *= max(1.0, float(np.abs(expected).max(initial=0)))
    trainer, _ = compile_case(case, dtype, device=device)
    y = case.target()
    out = trainer.predict(DUMMY)
    assert out.dtype == dtype, f"{case.name}: output dtype {out.dtype}, expected {np.dtype(dtype)}"
    _close(out, expected, f"{case.name}: forward", **tol)
    _close(trainer.step(DUMMY, y), reference_loss(case, expected, y), f"{case.name}: loss", **tol)


def _probes(case, i, size):
    if size <= MAX_PROBES:
        return np.arange(size)
    return rng_for(case.name, "probe", i).choice(size, MAX_PROBES, replace=False)


def check_backward(case, device="cpu"):
    trainer, net = compile_case(case, device=device)
    y = case.target()
    trainer.step(DUMMY, y)
    holders = net.holders()
    analytic = {i: host(holders[i].grad) for i in case.checked}
    for i, g in analytic.items():
        flat = holders[i].data.reshape(-1)       # a view of the trainer's parameter
        assert _same_memory(flat, holders[i].data)
        idx = _probes(case, i, flat.size)
        numeric = np.empty(len(idx))
        for k, j in enumerate(idx):
            old = float(flat[j])
            flat[j] = old + EPS
            lp = trainer.step(DUMMY, y)
            flat[j] = old - EPS
            lm = trainer.step(DUMMY, y)
            flat[j] = old
            numeric[k] = (lp - lm) / (2 * EPS)
        _close(g.reshape(-1)[idx], numeric, f"{case.name}: d loss / d input {i}", **GRAD_TOL)


def _same_memory(a, b):
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    return a.data.ptr == b.data.ptr      # a device array: the same device address


def check_torch(case, device="cpu"):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    ts = [torch.tensor(np.array(a), requires_grad=(i in case.checked)) for i, a in enumerate(case.inputs)]
    out = case.torch(F, *ts)
    y = case.target()
    loss = F.cross_entropy(out, torch.tensor(y)) if case.loss == "ce" else F.mse_loss(out, torch.tensor(y))
    loss.backward()

    trainer, net = compile_case(case, device=device)
    _close(trainer.predict(DUMMY), out.detach().numpy(), f"{case.name}: forward vs torch", **TORCH_TOL)
    _close(trainer.step(DUMMY, y), loss.item(), f"{case.name}: loss vs torch", **TORCH_TOL)
    holders = net.holders()
    for i in case.checked:
        _close(host(holders[i].grad), ts[i].grad.numpy(), f"{case.name}: grad of input {i} vs torch", **TORCH_TOL)


def op_tests(cases, dtype_ids=("f64", "f32")):
    """The three checks over ``cases`` as pytest tests (forward in float64 and float32, finite differences,
    torch), each case xfail'ed where it names a bug; a test module binds them to names of its own:
    ``test_forward, test_finite_differences, test_against_torch = op_tests(CASES)``."""
    @pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=dtype_ids)
    @pytest.mark.parametrize("case", [c.param("forward") for c in cases])
    def test_forward(case, dtype):
        check_forward(case, dtype)

    @pytest.mark.parametrize("case", [c.param("backward") for c in cases])
    def test_finite_differences(case):
        check_backward(case)

    @pytest.mark.parametrize("case", [c.param("torch") for c in cases])
    def test_against_torch(case):
        check_torch(case)

    return test_forward, test_finite_differences, test_against_torch


# ------------------------------------------------------- one op outside a graph
def run_op(op, arrays, gy=None, seed=0, saved_as=None):
    """(outputs, input gradients) of ``op`` on ``arrays`` on the CPU backend, each pass handed exactly the
    workspace it asks for and a random stream seeded with ``seed``; the backward (when ``gy``, the first
    output's gradient, is given) gets the inputs and outputs the op saves and None for the others. With
    ``saved_as`` (a dtype) each saved floating-point output is rounded through it before the backward
    reads it, as a low-precision run stores it."""
    from minidnn.backend.cpu import CPUBackend
    from minidnn.executor import Context
    from minidnn.graph import Spec
    be = CPUBackend()
    specs = [Spec(a.shape, a.dtype) for a in arrays]
    out_specs = op.infer(*specs)
    outs = [np.empty(s.shape, s.dtype) for s in out_specs]
    op.forward(Context.on(be, np.random.default_rng(seed)), list(arrays), outs,
               be.empty(op.workspace(specs, out_specs)))
    if gy is None:
        return outs, None
    gins = [None if i in op.no_grad_inputs else np.empty(s.shape, s.dtype) for i, s in enumerate(specs)]
    ins = [a if i in op.saved_inputs else None for i, a in enumerate(arrays)]
    saved = [o if i in op.saved_outputs else None for i, o in enumerate(outs)]
    for o in saved:
        if saved_as is not None and o is not None and o.dtype.kind == "f":
            o[...] = o.astype(saved_as)
    op.backward(Context.on(be, np.random.default_rng(seed)), ins, saved,
                [np.asarray(gy, out_specs[0].dtype)] + [None] * (len(outs) - 1), gins,
                be.empty(op.backward_workspace(specs, out_specs)))
    return outs, gins


# ------------------------------------------------------- whole networks vs PyTorch
def step_matches_torch(trainer, net, tnet, x, y, rtol):
    """One ``trainer.step(x, y)`` of ``net`` (cross-entropy, float64) against the same step of ``tnet``, its
    PyTorch twin: the losses agree to 1e-10 relative, and every parameter's gradient is nonzero and agrees
    to ``rtol``."""
    torch = pytest.importorskip("torch")
    tloss = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y))
    tloss.backward()
    loss = trainer.step(x, y)
    assert abs(loss - tloss.item()) <= 1e-10 * abs(tloss.item())
    tparams = dict(tnet.named_parameters())
    for n, p in net.named_parameters():
        g = tparams[n].grad.numpy()
        assert np.abs(g).max() > 0, n
        np.testing.assert_allclose(host(p.grad), g, rtol=rtol, atol=1e-12, err_msg=n)
