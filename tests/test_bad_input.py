"""Every bad input gets a clear, catchable error that says what was expected."""

import re

import numpy as np
import pytest

import minidnn
from minidnn import nn, optim
from minidnn.memory import parse_bytes


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                        nn.Linear(84, 10))

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn1(self.conv1(x)))


class Nested(nn.Module):
    """conv1 (3 -> c0), then layer1 = [Block(c1_in, ...), ...]."""

    def __init__(self, c0=8, c1_in=8, bn_channels=None, fc_in=16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c0, 3, padding=1)
        self.layer1 = nn.Sequential(Block(c1_in, 16), Block(16, 16))
        if bn_channels is not None:
            self.layer1[1].bn1 = nn.BatchNorm2d(bn_channels)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(fc_in, 10)

    def forward(self, x):
        return self.fc(self.flatten(self.pool(self.layer1(self.conv1(x)))))


SHAPE = (4, 1, 28, 28)


@pytest.fixture
def lenet_trainer():
    net = LeNet().init_parameters(0)
    return minidnn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9))


def good_batch(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n,) + SHAPE[1:]).astype(np.float32), rng.integers(0, 10, n)


def snapshot(net):
    return {k: np.array(v, copy=True) for k, v in net.state_dict().items()}


def assert_unchanged(net, before, keys=None):
    for k, v in net.state_dict().items():
        if keys is None or k in keys:
            assert np.array_equal(v, before[k], equal_nan=True), k


# -- input and labels -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 1, 32, 32), (4, 3, 28, 28), (4, 28, 28), (4, 1, 28, 28, 1)])
def test_wrong_input_shape(lenet_trainer, shape):
    net = lenet_trainer.net
    before = snapshot(net)
    _, y = good_batch()
    with pytest.raises(minidnn.ShapeError) as e:
        lenet_trainer.step(np.zeros(shape, np.float32), y)
    msg = str(e.value)
    assert "(batch, 1, 28, 28)" in msg and str(shape) in msg
    assert isinstance(e.value, ValueError) and isinstance(e.value, minidnn.MinidnnError)
    assert_unchanged(net, before)
    assert lenet_trainer.steps_done == 0


def test_wrong_input_shape_to_predict(lenet_trainer):
    with pytest.raises(minidnn.ShapeError, match=re.escape("(batch, 1, 28, 28)")):
        lenet_trainer.predict(np.zeros((2, 1, 27, 28), np.float32))


def test_non_numeric_input(lenet_trainer):
    _, y = good_batch()
    with pytest.raises(minidnn.ShapeError, match="numeric"):
        lenet_trainer.step(np.full(SHAPE, "a"), y)


@pytest.mark.parametrize("labels", [[0, 1, 10, 2], [0, -1, 3, 2], [99, 0, 0, 0]])
def test_labels_out_of_range(lenet_trainer, labels):
    x, _ = good_batch()
    before = snapshot(lenet_trainer.net)
    with pytest.raises(ValueError) as e:
        lenet_trainer.step(x, np.array(labels))
    msg = str(e.value)
    assert "[0, 10)" in msg
    assert str(min(labels)) in msg and str(max(labels)) in msg
    assert_unchanged(lenet_trainer.net, before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_])
def test_non_integer_labels_for_cross_entropy(lenet_trainer, dtype):
    x, y = good_batch()
    with pytest.raises(ValueError) as e:
        lenet_trainer.step(x, y.astype(dtype))
    msg = str(e.value)
    assert "integer" in msg and np.dtype(dtype).name in msg


@pytest.mark.parametrize("shape", [(3,), (4, 1), (5,)])
def test_labels_of_wrong_shape(lenet_trainer, shape):
    x, _ = good_batch()
    with pytest.raises(minidnn.ShapeError) as e:
        lenet_trainer.step(x, np.zeros(shape, np.int64))
    assert "(4,)" in str(e.value) and str(shape) in str(e.value)


def test_integer_input_is_accepted(lenet_trainer):
    """Not an error: integer images are cast to the training dtype."""
    _, y = good_batch()
    loss = lenet_trainer.step(np.ones(SHAPE, np.uint8), y)
    assert np.isfinite(loss)


# -- shapes inside the network, found at compile time and named by module path ------------------

def test_nested_net_compiles_when_shapes_fit():
    trainer = minidnn.compile(Nested(), (2, 3, 8, 8), nn.CrossEntropyLoss())
    assert np.isfinite(trainer.step(np.ones((2, 3, 8, 8), np.float32), np.array([0, 9])))


def test_conv_channel_mismatch_names_the_module_path():
    net = Nested(c0=8, c1_in=24)      # layer1.0.conv1 expects 24 channels, conv1 gives 8
    with pytest.raises(minidnn.ShapeError) as e:
        minidnn.compile(net, (2, 3, 8, 8), nn.CrossEntropyLoss())
    msg = str(e.value)
    assert "layer1.0.conv1" in msg
    assert re.search(r"\b24\b", msg) and re.search(r"\b8\b", msg), msg
    assert "expected 24 input channels, got 8" in msg


def test_batchnorm_channel_mismatch_names_the_module_path():
    net = Nested(bn_channels=12)      # layer1.1.bn1 has 12 channels, layer1.1.conv1 gives 16
    with pytest.raises(minidnn.ShapeError) as e:
        minidnn.compile(net, (2, 3, 8, 8), nn.CrossEntropyLoss())
    msg = str(e.value)
    assert "layer1.1.bn1" in msg and "12" in msg and "16" in msg


def test_linear_feature_mismatch_names_the_module_path():
    net = Nested(fc_in=32)
    with pytest.raises(minidnn.ShapeError) as e:
        minidnn.compile(net, (2, 3, 8, 8), nn.CrossEntropyLoss())
    msg = str(e.value)
    assert "fc" in msg and "32" in msg and "16" in msg


def test_linear_given_a_4d_input():
    class NoFlatten(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 4, 3))
            self.head = nn.Sequential(nn.Linear(4 * 6 * 6, 10))

        def forward(self, x):
            return self.head(self.features(x))

    with pytest.raises(minidnn.ShapeError) as e:
        minidnn.compile(NoFlatten(), (2, 1, 8, 8), nn.CrossEntropyLoss())
    msg = str(e.value)
    assert "head.0" in msg and "2-D" in msg and "(2, 4, 6, 6)" in msg


def test_compile_shape_that_does_not_fit_the_first_layer():
    with pytest.raises(minidnn.ShapeError, match=r"features\.0.*expected 1 input channels, got 3"):
        minidnn.compile(LeNet(), (4, 3, 28, 28), nn.CrossEntropyLoss())


# -- numerical errors -----------------------------------------------------------------------------

def test_nan_loss_raises_and_leaves_parameters_unchanged(lenet_trainer):
    x, y = good_batch()
    lenet_trainer.step(x, y)                      # momentum buffers are non-zero from here on
    before = snapshot(lenet_trainer.net)
    grads = {n: np.array(p.grad, copy=True) for n, p in lenet_trainer.net.named_parameters()}
    bad = x.copy()
    bad[1, 0, 3, 4] = np.nan
    with pytest.raises(minidnn.NumericalError) as e:
        lenet_trainer.step(bad, y)
    msg = str(e.value)
    assert "nan" in msg.lower() and "step" in msg and "cross_entropy" in msg
    assert isinstance(e.value, FloatingPointError)
    assert_unchanged(lenet_trainer.net, before)
    assert lenet_trainer.steps_done == 1
    # the gradients of the failed step were never computed either
    for n, p in lenet_trainer.net.named_parameters():
        assert np.array_equal(p.grad, grads[n]), n
    # and the trainer still works: the next good step equals a trainer that never saw the bad batch
    ref = minidnn.compile(LeNet().init_parameters(0), SHAPE, nn.CrossEntropyLoss(),
                          optim.SGD(lr=0.1, momentum=0.9))
    ref.step(x, y)
    x2, y2 = good_batch(seed=1)
    assert lenet_trainer.step(x2, y2) == ref.step(x2, y2)
    for (n, p), (_, q) in zip(lenet_trainer.net.named_parameters(), ref.net.named_parameters()):
        assert np.array_equal(p.data, q.data), n


def test_nan_loss_under_a_tight_budget_then_training_continues():
    """The error aborts a step with copies in flight (offload/prefetch); the next steps are unaffected."""
    with pytest.raises(minidnn.MemoryBudgetError) as e:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                        memory=minidnn.MemoryConfig(budget=1, algorithms="default", sub_batching=False))
    tight = minidnn.compile(LeNet().init_parameters(0), SHAPE, nn.CrossEntropyLoss(),
                            optim.SGD(lr=0.1, momentum=0.9),
                            memory=minidnn.MemoryConfig(budget=e.value.minimum_bytes, check=True, poison=True,
                                                        algorithms="default", sub_batching=False))
    assert {"offload", "prefetch"} <= {s.kind for s in tight.plan.steps}
    ref = minidnn.compile(LeNet().init_parameters(0), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                          memory=minidnn.MemoryConfig(algorithms="default"))
    x, y = good_batch()
    assert tight.step(x, y) == ref.step(x, y)
    before = snapshot(tight.net)
    bad = x.copy()
    bad[2] = np.nan
    with pytest.raises(minidnn.NumericalError):
        tight.step(bad, y)
    assert_unchanged(tight.net, before)
    for s in range(2, 5):
        xb, yb = good_batch(seed=s)
        assert tight.step(xb, yb) == ref.step(xb, yb)
    for (n, p), (_, q) in zip(tight.net.named_parameters(), ref.net.named_parameters()):
        assert np.array_equal(p.data, q.data), n


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_inf_input_gives_numerical_error(lenet_trainer):
    x, y = good_batch()
    x[0] = np.inf
    with pytest.raises(minidnn.NumericalError):
        lenet_trainer.step(x, y)


def test_nan_loss_leaves_batchnorm_statistics_unchanged():
    net = Nested().init_parameters(0)
    trainer = minidnn.compile(net, (2, 3, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    y = np.array([1, 2])
    trainer.step(x, y)
    before = snapshot(net)
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(minidnn.NumericalError):
        trainer.step(x, y)
    params = {n for n, _ in net.named_parameters()}
    assert_unchanged(net, before, keys=params)
    assert_unchanged(net, before)                   # the BN running statistics too


# -- memory budgets -------------------------------------------------------------------------------

def test_budget_below_the_liveness_plan_peak_without_eviction():
    unlimited = minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    peak = unlimited.plan.peak_bytes            # the liveness-only plan: nothing evicted
    with pytest.raises(minidnn.MemoryBudgetError) as e:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1),
                        memory=minidnn.MemoryConfig(budget=peak - 1, policy="none", sub_batching=False))
    assert e.value.minimum_bytes == peak
    assert f"({peak} B)" in str(e.value) and f"({peak - 1} B)" in str(e.value)
    assert isinstance(e.value, ValueError)
    # exactly the minimum is accepted
    t = minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1),
                        memory=minidnn.MemoryConfig(budget=peak, policy="none"))
    assert t.plan.peak_bytes <= peak


def test_budget_below_the_planner_minimum():
    """With eviction, the stated minimum is what the planner can reach - and it is feasible."""
    with pytest.raises(minidnn.MemoryBudgetError) as e:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1), memory=4096)
    minimum = e.value.minimum_bytes
    assert f"({minimum} B)" in str(e.value) and "step" in str(e.value)
    unlimited = minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    assert unlimited.persistent_bytes < minimum <= unlimited.plan.peak_bytes
    t = minidnn.compile(LeNet().init_parameters(0), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1),
                        memory=minidnn.MemoryConfig(budget=minimum, check=True, poison=True))
    assert t.plan.peak_bytes <= minimum
    x, y = good_batch()
    assert np.isfinite(t.step(x, y))
    assert t.measured_peak_bytes == t.plan.peak_bytes <= minimum
    with pytest.raises(minidnn.MemoryBudgetError) as e2:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1), memory=minimum - 1)
    assert e2.value.minimum_bytes == minimum


@pytest.mark.parametrize("budget", ["12 parsecs", "lots", "", "-5MiB", "1.5.3GB", "12 GiBs", "MiB"])
def test_unparseable_budget(budget):
    with pytest.raises(ValueError) as e:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), memory=budget)
    assert repr(budget) in str(e.value)
    assert not isinstance(e.value, minidnn.MemoryBudgetError)


@pytest.mark.parametrize("budget", [0, 1.5, 0.0, "0%", "150%", -3])
def test_out_of_range_budget(budget):
    with pytest.raises(ValueError) as e:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), memory=budget)
    assert not isinstance(e.value, minidnn.MemoryBudgetError)


def test_budget_strings_that_parse():
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(" 512 MiB ") == 512 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("12GiB") == 12 * 2**30
    assert parse_bytes("16gb") == 16 * 10**9
    assert parse_bytes(4096) == 4096
    assert parse_bytes("4096") == 4096


def test_unknown_memory_policy():
    with pytest.raises(ValueError, match="bogus"):
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(),
                        memory=minidnn.MemoryConfig(budget=10**5, policy="bogus"))


# -- devices --------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["tpu", "gpu", "CPU ", "cuda0"])
def test_unknown_device(device):
    with pytest.raises(ValueError) as e:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), device=device)
    assert repr(device) in str(e.value) and "'cpu'" in str(e.value)
    assert not isinstance(e.value, minidnn.BackendUnavailable)


def test_cuda_unavailable_here():
    cupy = None
    try:
        import cupy  # noqa: F401
        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a CUDA device is present")
    except Exception:
        pass
    with pytest.raises(minidnn.BackendUnavailable) as e:
        minidnn.compile(LeNet(), SHAPE, nn.CrossEntropyLoss(), device="cuda")
    assert "cuda" in str(e.value)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, minidnn.MinidnnError)


def test_torch_imported_first_is_named_with_the_fix(tmp_path):
    """PyTorch loads the OpenMP runtime with spinning threads before minidnn can ask for passive
    ones; the CPU backend says so and how to avoid it (a fresh process: the policy is per process).
    The process runs outside the checkout, so that it imports the installed package, not the sources."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    code = ("import warnings, torch, minidnn\n"
            "from minidnn.backend import get_backend\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    get_backend('cpu')\n"
            "print([str(x.message) for x in w])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout
    assert "import minidnn first" in out and "OMP_WAIT_POLICY=PASSIVE" in out
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout
    assert out.strip() == "[]"


# -- empty batches, out-of-range hyperparameters, what the NaN message names ----------------------------

def test_empty_batch_to_step_or_predict_is_a_shape_error(lenet_trainer):
    before = snapshot(lenet_trainer.net)
    empty = np.zeros((0,) + SHAPE[1:], np.float32)
    with pytest.raises(minidnn.ShapeError, match="the batch is empty"):
        lenet_trainer.step(empty, np.zeros(0, np.int64))
    with pytest.raises(minidnn.ShapeError, match="the batch is empty"):
        lenet_trainer.predict(empty)
    assert_unchanged(lenet_trainer.net, before)
    assert lenet_trainer.steps_done == 0


@pytest.mark.parametrize("kwargs,name", [({"lr": float("nan")}, "lr"), ({"lr": float("inf")}, "lr"),
                                         ({"lr": -0.1}, "lr"), ({"momentum": -1}, "momentum"),
                                         ({"momentum": 2}, "momentum"), ({"weight_decay": -1e-4}, "weight_decay"),
                                         ({"dampening": 1.5}, "dampening")])
def test_sgd_refuses_hyperparameters_out_of_range_naming_them(kwargs, name):
    with pytest.raises(minidnn.ConfigError, match=f"^{name} must be"):
        optim.SGD(**{"lr": 0.1, **kwargs})


@pytest.mark.parametrize("kwargs,name", [({"lr": float("nan")}, "lr"), ({"betas": (0.9, 1.0)}, r"betas\[1\]"),
                                         ({"eps": -1}, "eps"), ({"weight_decay": -1}, "weight_decay")])
def test_adam_refuses_hyperparameters_out_of_range_naming_them(kwargs, name):
    with pytest.raises(minidnn.ConfigError, match=f"^{name} must be"):
        optim.Adam(**kwargs)
    assert optim.SGD(lr=0.0, momentum=1.0, weight_decay=0.0).momentum == 1.0     # the closed ends are valid


def test_nan_loss_names_the_training_step_and_the_op(lenet_trainer):
    x, y = good_batch()
    lenet_trainer.step(x, y)
    lenet_trainer.step(x, y)
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(minidnn.NumericalError) as e:
        lenet_trainer.step(x, y)
    msg = str(e.value)
    assert "at training step 3, computed by " in msg and ":cross_entropy" in msg and "program step" in msg


# -- the command line: one line, naming the option ------------------------------------------------------

def cli_error(capsys, tmp_path, *argv):
    from minidnn import cli
    rc = cli.main(["train", "--no-progress", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("minidnn: error: "), err
    return err[0]


@pytest.mark.parametrize("argv,words", [
    (["--lr", "nan"], "lr must be >= 0"), (["--momentum", "-1"], "momentum must be in [0.0, 1.0]"),
    (["--momentum", "2"], "momentum must be in [0.0, 1.0], got 2.0"), (["--weight-decay", "-0.1"], "weight_decay must"),
    (["--pad", "-1"], "--pad must be at least 0, got -1"),
    (["--image-size", "-5"], "--image-size must be at least 1, got -5"),
    (["--data", "synthetic:0x32x32"], "shape 0x32x32"), (["--data", "synthetic:3x32x32:n=0"], "n=0"),
    (["--data", "synthetic:3x32x32:classes=0"], "0 classes"),
    (["--trace-dir", "T", "--trace-step", "999", "--data", "synthetic:1x28x28:n=16", "--epochs", "2",
      "--batch-size", "8"], "--trace-step 999 lies past the last step of this run (4 steps: 2 epochs of 2 batches)"),
])
def test_train_options_out_of_range_are_one_line(capsys, tmp_path, argv, words):
    assert words in cli_error(capsys, tmp_path, *argv)
