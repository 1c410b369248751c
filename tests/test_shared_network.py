"""The network's arrays are the truth: a trainer trains the weights the network has now, whether a
second trainer compiled on it, or the user replaced or loaded its arrays, since the trainer's last step.
Each trainer keeps its own optimizer state (as two PyTorch optimizers over one model do)."""

import numpy as np
import pytest

import minidnn as mdn
from harness import host
from minidnn import nn, optim
from networks import make_resnet

SHAPE = (8, 3, 16, 16)


def batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 10, SHAPE[0])


def trainer_on(net):
    return mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))


def copy_of(net):
    other = make_resnet(nn)
    other.load_state_dict({k: host(v).copy() for k, v in net.state_dict().items()})
    return other


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        assert np.array_equal(host(sa[k]), host(sb[k])), k


def test_the_older_of_two_trainers_trains_the_newer_ones_weights_with_its_own_momentum():
    net = make_resnet(nn).init_parameters(0)
    t1 = trainer_on(net)
    t1.step(*batch(0))
    t2 = trainer_on(net)
    t2.step(*batch(1))
    # what t1's next step must be: its momentum (one step old) applied to the weights t2 left
    ref_net = copy_of(net)
    ref = trainer_on(ref_net)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        ref.store.optimizer_state(q, "momentum_buffer")[...] = t1.store.optimizer_state(p, "momentum_buffer")
    ref.steps_done = t1.steps_done
    x, y = batch(2)
    assert t1.step(x, y) == ref.step(x, y)
    assert_same_state(net, ref_net)
    assert np.array_equal(t1.predict(x), t2.predict(x))
    assert np.array_equal(t1.predict(x), ref.predict(x))
    # and back: t2 trains what t1 left
    ref2 = trainer_on(copy_of(net))
    assert t2.step(*batch(3)) == ref2.step(*batch(3))


def test_weights_the_user_replaced_or_loaded_between_steps_are_trained():
    net = make_resnet(nn).init_parameters(0)
    t = trainer_on(net)
    x, y = batch(0)
    t.step(x, y)
    t.predict(x)                                    # every plan bound before the change
    net.fc.weight.data = np.zeros((10, 16))         # a new array, float64: cast to the training dtype
    out = t.predict(x)
    assert np.array_equal(out, np.broadcast_to(host(net.fc.bias.data), out.shape))
    assert net.fc.weight.data.dtype == np.float32
    other = make_resnet(nn).init_parameters(7)
    net.load_state_dict(other.state_dict())        # in place, into the arrays the trainer holds
    ref = trainer_on(copy_of(other))
    assert np.array_equal(t.predict(x), ref.predict(x))
    assert t.step(*batch(1)) == ref.step(*batch(1))     # the loss of the loaded weights (momentum differs)


def test_a_replaced_array_of_the_wrong_shape_is_refused_naming_it():
    net = make_resnet(nn).init_parameters(0)
    t = trainer_on(net)
    net.fc.weight.data = np.zeros((10, 15), np.float32)
    with pytest.raises(mdn.ShapeError, match=r"fc\.weight.*\(10, 15\).*\(10, 16\)"):
        t.step(*batch(0))
