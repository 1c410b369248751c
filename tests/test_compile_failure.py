"""A ``compile`` that fails changes nothing (issue 31, item 5): a dtype the kernels cannot train in
is refused before the network is touched, and any later failure (a budget below the minimum)
leaves the network's arrays - the very objects, their dtype and values - as they were."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn, optim
from networks import make_resnet

SHAPE = (4, 3, 16, 16)


def arrays(net):
    return {name: t.data for name, t in [*net.named_parameters(), *net.named_buffers()]}


def assert_untouched(net, saved):
    now = arrays(net)
    assert now.keys() == saved.keys()
    for name, a in saved.items():
        assert now[name] is a, f"{name}: the network's array was replaced"


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.complex64, "no such dtype"])
def test_a_dtype_the_kernels_cannot_train_in_is_refused_before_any_cast(dtype):
    net = make_resnet(nn).init_parameters(0)
    saved = arrays(net)
    values = {k: v.copy() for k, v in saved.items()}
    with pytest.raises(mdn.ConfigError, match=r"dtype must be one of float32, float64"):
        mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1), dtype=dtype)
    assert_untouched(net, saved)
    for k, v in values.items():
        np.testing.assert_array_equal(saved[k], v)


def test_a_compile_that_fails_after_casting_leaves_the_network_as_it_was():
    """float64 under a budget below the minimum: the weights were cast and moved into a persistent
    region before the planner refused; the network keeps its float32 arrays."""
    net = make_resnet(nn).init_parameters(0)
    saved = arrays(net)
    with pytest.raises(mdn.MemoryBudgetError):
        mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1), dtype=np.float64, memory=4096)
    assert_untouched(net, saved)
    assert all(p.grad is None for p in net.parameters())


def test_a_failed_second_compile_leaves_the_first_trainer_training_its_weights():
    net = make_resnet(nn).init_parameters(0)
    first = mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    saved = arrays(net)
    grads = {name: p.grad for name, p in net.named_parameters()}
    with pytest.raises(mdn.MemoryBudgetError):
        mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1), memory=4096)
    assert_untouched(net, saved)
    assert all(p.grad is grads[name] for name, p in net.named_parameters())
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 10, SHAPE[0])
    before = net.fc.weight.data.copy()
    first.step(x, y)
    assert not np.array_equal(net.fc.weight.data, before)          # the first trainer still trains the network
