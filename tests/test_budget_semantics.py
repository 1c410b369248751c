"""What a budget may change and what it may not.

- Every budget that training accepts runs evaluation too: an eval batch that
  does not fit is run in chunks (eval-mode BatchNorm normalizes each sample
  alone, so chunks change nothing but a kernel's summation order).
- ``minidnn plan`` plans the split ``minidnn train`` makes, and reports its minimum.
- Offload, prefetch and recomputation change no bit: with
  ``algorithms="default"`` a step planned under 60% or 40% of its liveness
  peak trains bitwise like the unlimited one (poison on).
- Every plan kind has one interface, and the trainer runs each through it.
"""
import json
import re

import numpy as np
import pytest

import minidnn as mdn
from harness import host
from minidnn import models, nn, optim
from minidnn.cli import main
from minidnn.memory import MemoryConfig

SHAPE = (4, 3, 32, 32)    # small enough for 2 cores; at its minimum, eval of the full batch does not fit whole


def resnet():
    return models.get("resnet20").init_parameters(0)


def batch(seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 10, SHAPE[0])


def compile_(net, memory):
    return mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9), memory=memory)


def minimum(memory):
    with pytest.raises(mdn.MemoryBudgetError) as e:
        compile_(resnet(), memory)
    return e.value.minimum_bytes


def test_predict_runs_within_the_smallest_budget_training_accepts():
    """At the minimum that ``compile`` advertises, a step trains split and ``predict`` on the full batch
    runs in chunks within the budget. Its outputs are an unlimited trainer's on the same chunks bit for
    bit (eval-mode BatchNorm normalizes each sample alone), and the whole batch's up to float rounding
    (a kernel's summation order may depend on how many samples it gets)."""
    least = minimum(MemoryConfig(budget=1, algorithms="default"))
    trainer = compile_(resnet(), MemoryConfig(budget=least, algorithms="default", poison=True, check=True))
    assert trainer.plan.k > 1 and trainer.plan.peak_bytes <= least
    x, y = batch()
    trainer.step(x, y)
    got = trainer.predict(x)
    chunks = trainer.plan_for(SHAPE, training=False)
    assert chunks.k > 1 and "eval in" in chunks.summary()
    assert trainer.measured_peak_bytes <= least
    ref = compile_(resnet(), MemoryConfig(algorithms="default"))
    ref.net.load_state_dict(trainer.net.state_dict())
    b = chunks.sub_batch
    by_chunk = np.concatenate([ref.predict(x[j * b:(j + 1) * b]) for j in range(chunks.k)])
    assert got.shape == (SHAPE[0], 10) and np.array_equal(got, by_chunk)
    whole = ref.predict(x)
    assert ref.plan_for(SHAPE, training=False).k == 1
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)


def test_eval_too_small_even_in_chunks_of_one_names_the_minimum():
    trainer = compile_(resnet(), None)
    trainer.memory = MemoryConfig(budget=trainer.persistent_bytes + 1)     # no room for any activation
    with pytest.raises(mdn.MemoryBudgetError, match="even in chunks of 1 sample") as e:
        trainer.predict(batch()[0])
    assert e.value.minimum_bytes > trainer.persistent_bytes + 1


def train_resnet56(budget):
    """ResNet-56 (deep enough that a step fits whole in 40% of its liveness peak), 3 steps, algorithms="default"."""
    shape = (8, 3, 32, 32)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])
    trainer = mdn.compile(models.get("resnet56").init_parameters(0), shape, nn.CrossEntropyLoss(),
                          optim.SGD(lr=0.01, momentum=0.9),
                          memory=MemoryConfig(budget=budget, algorithms="default", sub_batching=False, poison=True,
                                              check=True))
    losses = [trainer.step(x, y) for _ in range(3)]
    return trainer, losses, {k: host(v).copy() for k, v in trainer.net.state_dict().items()}


@pytest.fixture(scope="module")
def unlimited_resnet56():
    return train_resnet56(None)


@pytest.mark.parametrize("frac", [0.6, 0.4])
def test_default_algorithms_train_bitwise_like_unlimited_memory_under_a_budget(frac, unlimited_resnet56):
    """The README's claim as written: with algorithms="default" the planner evicts (offloads and
    recomputes) to meet 60% or 40% of the liveness peak, and parameters, running statistics and
    losses after 3 steps are those of unlimited memory, bit for bit, with every freed byte poisoned."""
    ref, ref_losses, want = unlimited_resnet56
    trainer, losses, got = train_resnet56(frac)
    plan = trainer.plan
    assert plan.k == 1 and not plan.algorithm_changes and plan.evictions
    assert plan.peak_bytes <= int(frac * ref.plan.liveness_peak_bytes)
    assert losses == ref_losses
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def cli_json(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr().out
    return status, json.loads(out)


def test_plan_reports_the_minimum_that_train_accepts(capsys):
    """``minidnn plan`` and ``minidnn.compile`` make the same split, so they name one minimum (the
    planner's, at sub-batches of 1 sample); at that budget ``plan`` prints the split plan."""
    with pytest.raises(mdn.MemoryBudgetError) as e:
        mdn.compile(models.get("resnet20"), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                    memory=1)
    status, out = cli_json(capsys, "plan", "--model", "resnet20", "--batch-size", str(SHAPE[0]), "--budget", "1B",
                           "--profile", "cpu-2core", "--json")
    assert status == 2 and out["minimum_bytes"] == e.value.minimum_bytes
    assert "sub-batches of 1 sample" in out["error"]
    status, out = cli_json(capsys, "plan", "--model", "resnet20", "--batch-size", str(SHAPE[0]), "--budget",
                           str(e.value.minimum_bytes), "--profile", "cpu-2core", "--json")
    assert status == 0 and out["sub_batches"] > 1 and out["peak_bytes"] <= e.value.minimum_bytes
    status, _ = cli_json(capsys, "plan", "--model", "resnet20", "--batch-size", str(SHAPE[0]), "--budget",
                         str(e.value.minimum_bytes), "--profile", "cpu-2core", "--json", "--sub-batching", "off")
    assert status == 2


def test_plan_prints_the_sub_batched_plan_the_trainer_would_use(capsys):
    """VGG-16 at batch 256 does not fit 3 GiB whole; ``minidnn plan`` prints the split, as ``train``
    would run it, instead of an error."""
    assert main(["plan", "--model", "vgg16", "--batch-size", "256", "--image-size", "224", "--budget", "3GiB"]) == 0
    out = capsys.readouterr().out
    assert "sub-batching:" in out and "sub-batches of" in out
    assert main(["plan", "--model", "vgg16", "--batch-size", "256", "--image-size", "224", "--budget", "3GiB",
                 "--sub-batching", "off"]) == 2


def test_every_plan_kind_has_one_interface():
    """Whole, split (staged: BatchNorm; by sub-batch: opt-in) and chunked plans answer the same questions."""
    x, y = batch()
    whole = compile_(resnet(), None)
    staged = compile_(resnet(), MemoryConfig(budget=minimum(MemoryConfig(budget=1, bn="exact")), bn="exact"))
    per_sub = compile_(resnet(), MemoryConfig(budget=minimum(MemoryConfig(budget=1, bn="sub-batch")),
                                              bn="sub-batch"))
    plans = [whole.plan, staged.plan, per_sub.plan, staged.plan_for(SHAPE, training=False)]
    for plan in plans:
        assert plan.k * plan.sub_batch == SHAPE[0]
        assert plan.peak_bytes > 0 and plan.predicted_seconds > 0 and plan.summary()
    for trainer in (whole, staged, per_sub):
        assert trainer.plan.labels.shape == (SHAPE[0],) and trainer.plan.classes == 10
        assert np.isfinite(trainer.step(x, y))
    assert [p.k > 1 for p in plans] == [False, True, True, True]
    assert [p.batch_norm_updates for p in plans[:3]] == [1, 1, per_sub.plan.k]


def test_train_at_the_advertised_minimum_finishes_the_epoch(capsys, tmp_path):
    """``minidnn train`` names the smallest budget it accepts; at that budget the epoch trains in
    sub-batches, evaluates in chunks, and writes its checkpoint (evaluation used to fail there)."""
    args = ["train", "--model", "resnet20", "--data", "synthetic:3x32x32:n=16", "--batch-size", "16", "--epochs", "1",
            "--no-progress", "--out", str(tmp_path)]
    assert main(args + ["--budget", "1B"]) == 2
    least = int(re.search(r"minimum feasible [^(]*\((\d+) B\)", capsys.readouterr().err).group(1))
    assert main(args + ["--budget", str(least)]) == 0
    out = capsys.readouterr().out
    assert "sub-batches of 1" in out and "final test accuracy" in out
    assert (tmp_path / "checkpoint.safetensors").is_file()


@pytest.mark.parametrize("text, resolved", [("60%", 600), ("0.6", 600), (0.6, 600), ("1", 1000), ("4KiB", 4096),
                                            ("1000000", 1000000), (12345, 12345), (None, None)])
def test_one_reading_of_a_budget(text, resolved):
    """The API and the command line read a budget the same way (memory.config.parse_budget): a
    fraction of the liveness peak (here 1000 B) or bytes."""
    from minidnn.memory.config import MemoryConfig, parse_budget
    assert MemoryConfig(budget=text).resolve(1000) == resolved
    assert MemoryConfig(budget=parse_budget(text)).resolve(1000) == resolved


@pytest.mark.parametrize("text", ["0", "150%", "abc", 2.0, -5])
def test_a_budget_that_means_nothing_is_refused_by_name(text):
    from minidnn.memory.config import parse_budget
    with pytest.raises(ValueError, match="budget|size"):
        parse_budget(text)
