"""PyTorch's tensor idioms inside ``forward`` (issue #31 item 10).

Traced values take ``.view``, ``.reshape``, ``.flatten``, ``.relu()`` and arithmetic with Python
numbers (``y * 0.5``, ``0.5 * y``, ``y + 1``, ``y - 1``, ``1 - y``, ``y / 2``, ``-y``), so one
``forward`` runs unchanged in both frameworks: the network below is written once over a layer
namespace and checked against PyTorch in float64. An idiom they do not take is a TracingError
naming the module path, not a bare AttributeError/TypeError.
"""

import numpy as np
import pytest

import minidnn
from harness import FnModule, OpCase, host, op_tests, rng_for, step_matches_torch
from minidnn import nn as mnn
from minidnn import optim
from minidnn.errors import MinidnnError, ShapeError
from minidnn.graph import TracingError, trace

SHAPE = (4, 2, 4, 4)


def make_idioms(nn):
    """A small network using every idiom, over ``nn`` (minidnn.nn or torch.nn)."""

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 3, padding=1)

        def forward(self, x):
            y = self.conv(x).relu()
            y = 0.5 * (y * 1.5)
            y = (y + 1.0) - 0.25
            y = y / 2.0
            y = -(1.0 - y) + 2
            return y

    class Idioms(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = Body()
            self.fc1 = nn.Linear(48, 8)
            self.fc2 = nn.Linear(8, 5)

        def forward(self, x):
            y = self.body(x)                                  # (N, 3, 4, 4)
            a = y.view(y.size(0), -1)
            b = y.reshape((-1, 48))
            c = y.flatten(start_dim=1)
            d = y.flatten(1, 2).reshape(-1, 3 * 4, 4).view(y.shape[0], 48)   # end_dim, varargs
            e = y.flatten().view(y.size(0), 48)               # Tensor.flatten's default start_dim=0
            h = a + 0.5 * b - c * 0.25 + d - (e / 4.0)
            h = self.fc1(h).relu()
            return self.fc2(h)

    return Idioms


def _pair(seed=0):
    torch = pytest.importorskip("torch")
    net = make_idioms(mnn)().init_parameters(seed)
    tnet = make_idioms(torch.nn)()
    tnet.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    tnet.to(torch.float64)
    assert list(net.state_dict()) == list(tnet.state_dict())
    return net, tnet, torch


def _batch(step=0):
    rng = rng_for("idioms", step)
    return rng.standard_normal(SHAPE), rng.integers(0, 5, SHAPE[0]).astype(np.int64)


def test_graph_records_the_idioms():
    g = trace(make_idioms(mnn)(), SHAPE)
    names = {n.op.name for n in g.nodes}
    assert {"reshape", "relu", "mul_scalar", "add_scalar", "affine_scalar", "add"} <= names
    assert g.outputs[0].shape == (4, 5)
    paths = {n.path for n in g.nodes if n.op.name.endswith("_scalar")}
    assert paths == {"body", ""}


def test_forward_and_gradients_match_torch():
    net, tnet, torch = _pair()
    x, y = _batch()
    trainer = minidnn.compile(net, SHAPE, mnn.CrossEntropyLoss(), optimizer=None, dtype=np.float64,
                              memory=minidnn.MemoryConfig(check=True, poison=True))
    out = tnet(torch.from_numpy(x))
    np.testing.assert_allclose(trainer.predict(x), out.detach().numpy(), rtol=1e-10, atol=1e-12)
    step_matches_torch(trainer, net, tnet, x, y, rtol=1e-9)


def test_trains_one_step_like_torch():
    net, tnet, torch = _pair(seed=1)
    before = {k: np.array(v) for k, v in net.state_dict().items()}
    hp = dict(lr=0.1, momentum=0.9)
    trainer = minidnn.compile(net, SHAPE, mnn.CrossEntropyLoss(), optimizer=optim.SGD(**hp), dtype=np.float64)
    topt = torch.optim.SGD(tnet.parameters(), **hp)
    x, y = _batch(1)
    loss = trainer.step(x, y)
    tloss = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y))
    tloss.backward()
    topt.step()
    assert np.isfinite(loss) and abs(loss - tloss.item()) <= 1e-10 * abs(tloss.item())
    tsd = tnet.state_dict()
    for k, v in net.state_dict().items():
        assert not np.array_equal(host(v), before[k]), f"{k} did not move"
        np.testing.assert_allclose(host(v), tsd[k].detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


# ---------------------------------------------------- each idiom through the op harness
def _x(name, shape=(2, 3, 4)):
    return rng_for(name, "x").standard_normal(shape)


def _case(name, fn, shape=(2, 3, 4)):
    """``fn`` is applied to a traced value, a NumPy array and a torch tensor alike."""
    return OpCase(name, lambda x: fn(x), [_x(name, shape)], lambda x: fn(np.asarray(x)),
                  torch=lambda F, x: fn(x))


def _np_or(fn_np, fn):
    """``fn`` on traced values and tensors, ``fn_np`` on NumPy arrays (which lack a method)."""
    return lambda x: fn_np(x) if isinstance(x, np.ndarray) else fn(x)


CASES = [
    _case("mul_scalar", lambda x: x * 0.5),
    _case("rmul_scalar", lambda x: -3 * x),
    _case("add_scalar", lambda x: x + 1.0),
    _case("radd_scalar", lambda x: 2 + x),
    _case("sub_scalar", lambda x: x - 1.0),
    _case("rsub_scalar", lambda x: 1.0 - x),
    _case("div_scalar", lambda x: x / 3.0),
    _case("neg", lambda x: -x),
    _case("chain", lambda x: (x * 0.5 + 1.0) / 2.0 - 0.25),
    _case("sub_tensor", lambda x: x - 2 * x),
    _case("view", lambda x: x.reshape(2, -1) if isinstance(x, np.ndarray) else x.view(2, -1)),
    _case("reshape_tuple", lambda x: x.reshape((4, -1, 2))),
    _case("flatten_1", _np_or(lambda x: x.reshape(2, 12), lambda x: x.flatten(start_dim=1))),
    _case("flatten_0_1", _np_or(lambda x: x.reshape(6, 4), lambda x: x.flatten(0, 1))),
    _case("flatten_default", _np_or(lambda x: x.reshape(24), lambda x: x.flatten())),
    _case("relu_method", _np_or(lambda x: np.maximum(x, 0), lambda x: x.relu())),
]


test_idiom_forward, test_idiom_finite_differences, test_idiom_matches_torch = op_tests(CASES, dtype_ids=None)


# ------------------------------------------------------------- unsupported idioms
def _trace_inner(fn, shape=SHAPE):
    net = mnn.Sequential(mnn.Identity(), mnn.Sequential(FnModule(fn)))
    return trace(net, shape)


@pytest.mark.parametrize("fn,what", [
    (lambda x: x.softmax(dim=1), ".softmax"),
    (lambda x: x.permute(0, 2, 3, 1), ".permute"),
    (lambda x: x[:, [0, 1]], "indexing"),
    (lambda x: x * x, "elementwise product"),
    (lambda x: x * "2", "multiplying by a str"),
    (lambda x: x + [1.0], "adding a list"),
    (lambda x: 1.0 / x, "dividing a float by a tensor"),
    (lambda x: x @ x, "@"),
    (lambda x: x ** 2, "**"),
    (lambda x: x.view(4, "a"), "dimensions must be ints"),
], ids=["softmax", "permute", "slice", "mul_tensor", "mul_str", "add_list", "rdiv", "matmul", "pow", "view_str"])
def test_unsupported_idiom_names_the_module(fn, what):
    with pytest.raises(TracingError) as ei:
        _trace_inner(fn)
    msg = str(ei.value)
    assert msg.startswith("1.0: "), msg              # the module path of the forward that did it
    assert what in msg and "traced values support" in msg, msg
    assert isinstance(ei.value, MinidnnError)


def test_unsupported_attribute_is_still_an_attribute_error():
    """hasattr and getattr with a default keep working on traced values."""
    seen = {}

    def probe(x):
        seen["has"] = hasattr(x, "softmax")
        seen["get"] = getattr(x, "is_cuda", "default")
        with pytest.raises(AttributeError):
            x._private
        return x.relu()

    _trace_inner(probe)
    assert seen == {"has": False, "get": "default"}


@pytest.mark.parametrize("fn,what", [
    (lambda x: x.view(3, -1), "cannot reshape"),
    (lambda x: x.view(-1, -1), "only one dimension can be -1"),
    (lambda x: x.reshape(5, 7), "cannot reshape"),
    (lambda x: x.flatten(2, 1), "start_dim (2) comes after end_dim (1)"),
    (lambda x: x.flatten(start_dim=4), "out of range"),
])
def test_bad_shapes_name_the_module(fn, what):
    with pytest.raises(ShapeError) as ei:
        _trace_inner(fn)
    msg = str(ei.value)
    assert msg.startswith("1.0 ("), msg
    assert what in msg and "(4, 2, 4, 4)" in msg, msg


def test_scalar_arithmetic_needs_floats():
    with pytest.raises(ShapeError, match=r"1\.0 \(mul_scalar\): .*floating-point"):
        trace(mnn.Sequential(mnn.Identity(), mnn.Sequential(FnModule(lambda x: x * 2))), SHAPE, dtype=np.int64)


def test_flatten_layer_takes_end_dim():
    g = trace(mnn.Flatten(1, 2), SHAPE)
    assert g.outputs[0].shape == (4, 8, 4)
