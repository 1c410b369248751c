"""The Python training workflow at the package's top level (issue 31, item 11): ``minidnn.fit``,
``evaluate``, ``save``, ``load`` and ``trainer.save_trace``; checkpoints whose model keys
``net.load_state_dict`` takes, the optimizer's state beside them in the same file (resuming exactly),
and the input normalization kept with the model. Before, fit's checkpoint keys carried ``model.``
prefixes and no normalization: a network loaded from one was evaluated at 20.4% instead of 100%."""
import numpy as np
import pytest
from safetensors.numpy import load_file

import minidnn as mdn
from minidnn import nn, optim
from minidnn.checkpoint import load_checkpoint, save_checkpoint
from minidnn.data import DataLoader, Dataset, load
from minidnn.models import lenet5
from test_cli import one_line_error, read_jsonl, run

SHAPE = (8, 1, 8, 8)
LENET = ["--model", "lenet5", "--data", "synthetic:1x28x28:classes=10:n=48", "--batch-size", "16", "--no-progress"]


def small_net():
    """BatchNorm statistics and dropout (the trainer's random stream) are state a resume must restore too."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5),
                         nn.Linear(4 * 8 * 8, 10)).init_parameters(seed=0)


def small_trainer(net=None, optimizer=True, **kwargs):
    return mdn.compile(net or small_net(), SHAPE, nn.CrossEntropyLoss(),
                       optim.Adam(lr=0.01) if optimizer else None, **kwargs)


def batches(n, seed=0):
    """Raw images far from zero mean and unit std, so a missing normalization shows."""
    rng = np.random.default_rng(seed)
    return [(rng.uniform(100, 200, SHAPE).astype(np.float32), rng.integers(0, 10, SHAPE[0])) for _ in range(n)]


NORMALIZE = ([150.0], [29.0])


def test_the_workflow_is_at_the_top_level():
    for name in ("fit", "evaluate", "save", "load"):
        assert name in mdn.__all__
    assert mdn.fit.__module__ == mdn.load.__module__ == "minidnn.training"


def test_checkpoint_keys_are_the_state_dict_and_the_optimizer_state_lies_beside_them(tmp_path):
    trainer = small_trainer(normalize=NORMALIZE)
    trainer.step(*batches(1)[0])
    path = tmp_path / "ckpt.safetensors"
    mdn.save(path, trainer)
    keys = set(load_file(str(path)))
    own = set(trainer.net.state_dict())
    assert own <= keys and all(k.startswith("optim.") for k in keys - own)
    assert {k for k in keys - own if k.endswith(".exp_avg")}          # Adam's moments are in the file
    state = mdn.load(path)
    assert set(state) == own
    other = small_net()
    other.load_state_dict(state)
    for (k, a), b in zip(trainer.net.state_dict().items(), other.state_dict().values()):
        np.testing.assert_array_equal(a, b, err_msg=k)


def test_load_resumes_exactly(tmp_path):
    data = batches(6)
    a = small_trainer()
    for x, y in data[:3]:
        a.step(x, y)
    path = tmp_path / "ckpt.safetensors"
    mdn.save(path, a)
    rest = [a.step(x, y) for x, y in data[3:]]
    b = mdn.load(path, small_trainer(small_net()))          # another network and trainer, weights drawn anew
    assert b.steps_done == 3
    assert [b.step(x, y) for x, y in data[3:]] == rest
    for (k, pa), pb in zip(a.net.state_dict().items(), b.net.state_dict().values()):
        np.testing.assert_array_equal(pa, pb, err_msg=k)


def test_the_normalization_is_kept_with_the_model_and_applied_after_load(tmp_path):
    data = batches(4)
    trainer = small_trainer(normalize=NORMALIZE)
    for x, y in data:
        trainer.step(x, y)
    x = data[0][0]
    expected = trainer.predict(x)
    unnormalized = small_trainer(small_net(), optimizer=False)   # the same weights, fed normalized inputs by hand
    unnormalized.net.load_state_dict(trainer.net.state_dict())
    np.testing.assert_array_equal(unnormalized.predict(np.float32((x - np.float32(150)) / np.float32(29))), expected)
    path = tmp_path / "ckpt.safetensors"
    mdn.save(path, trainer)
    loaded = mdn.load(path, small_trainer(small_net(), optimizer=False))    # to evaluate: no optimizer
    assert loaded.normalization == trainer.normalization
    np.testing.assert_array_equal(loaded.predict(x), expected)
    test = Dataset(np.concatenate([x for x, _ in data]), np.concatenate([y for _, y in data]), 10, "raw")
    assert mdn.evaluate(loaded, DataLoader(test, 8, shuffle=False)) == mdn.evaluate(
        trainer, DataLoader(test, 8, shuffle=False))
    with pytest.raises(mdn.ConfigError, match="normalized twice"):
        mdn.evaluate(loaded, DataLoader(test, 8, mean=[150.0], std=[29.0]))


def test_fit_refuses_a_loader_that_normalizes_outside_the_model():
    data = Dataset(np.zeros((8, 1, 8, 8), np.float32), np.zeros(8), 10, "zeros")
    with pytest.raises(mdn.ConfigError, match=r"compile\(\.\.\., normalize=\(mean, std\)\)"):
        mdn.fit(small_trainer(), DataLoader(data, 8, mean=[0.5], std=[0.2]), progress=False)


def test_fit_save_load_evaluate_on_the_digits(tmp_path):
    """The issue's probe: fit with the normalization, save, load into a fresh trainer, evaluate raw test
    images: the accuracy fit measured (before: 20.4% where fit said 100%)."""
    train, test = load("digits", "train", size=8), load("digits", "test", size=8)
    mean, std = train.images.mean(axis=(0, 2, 3)), train.images.std(axis=(0, 2, 3))
    trainer = mdn.compile(small_net(), (32, 1, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9),
                          normalize=(mean, std))
    history = mdn.fit(trainer, DataLoader(train, 32), DataLoader(test, 64, shuffle=False), epochs=2,
                      out_dir=tmp_path / "run", progress=False, log=lambda line: None)
    assert history[-1]["test_accuracy"] > 0.5
    fresh = small_trainer(small_net(), optimizer=False)
    mdn.load(tmp_path / "run" / "checkpoint.safetensors", fresh)
    assert mdn.evaluate(fresh, DataLoader(test, 64, shuffle=False)) == history[-1]["test_accuracy"]


def test_save_trace_writes_every_export(tmp_path):
    trainer = small_trainer()
    with pytest.raises(mdn.ConfigError, match="no training step has been recorded"):
        trainer.save_trace(tmp_path)
    trainer.step(*batches(1)[0])
    paths = trainer.save_trace(tmp_path / "trace")
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["memory.csv", "memory.png", "memory_snapshot.pickle",
                                                          "trace.json"]
    assert all((tmp_path / "trace" / p).stat().st_size > 0 for p in ("trace.json", "memory.png", "memory.csv"))


def as_format_1(path):
    """The checkpoint at ``path`` as minidnn wrote it before: model keys under ``model.``, format 1."""
    tensors, meta = load_checkpoint(path)
    state = {("model." + k if not k.startswith("optim.") else k): v for k, v in tensors.items()}
    save_checkpoint(path, state, {**meta, "format": 1})


def test_a_checkpoint_of_the_first_format_still_loads(tmp_path):
    trainer = small_trainer(normalize=NORMALIZE)
    data = batches(4)
    for x, y in data[:2]:
        trainer.step(x, y)
    path = tmp_path / "old.safetensors"
    mdn.save(path, trainer)
    as_format_1(path)
    assert set(mdn.load(path)) == set(trainer.net.state_dict())
    b = mdn.load(path, small_trainer(small_net()))
    assert b.normalization == trainer.normalization
    assert [b.step(x, y) for x, y in data[2:]] == [trainer.step(x, y) for x, y in data[2:]]


def test_a_checkpoint_of_a_newer_format_is_one_clear_error(tmp_path):
    path = tmp_path / "new.safetensors"
    mdn.save(path, small_trainer())
    tensors, meta = load_checkpoint(path)
    save_checkpoint(path, tensors, {**meta, "format": 3})
    with pytest.raises(mdn.CheckpointError, match="newer minidnn .checkpoint format 3; this one reads formats 1 to 2"):
        mdn.load(path)


class OptimNamed(nn.Module):
    def __init__(self):
        super().__init__()
        self.optim = nn.Linear(64, 10)

    def forward(self, x):
        return self.optim(nn.flatten(x))


def test_a_top_level_module_named_optim_is_refused_on_save(tmp_path):
    trainer = mdn.compile(OptimNamed().init_parameters(seed=0), SHAPE, nn.CrossEntropyLoss())
    with pytest.raises(mdn.CheckpointError, match="a top-level module may not be named 'optim'"):
        mdn.save(tmp_path / "x.safetensors", trainer)


def test_the_cli_checkpoint_loads_into_python_with_its_normalization(tmp_path, capsys):
    """``minidnn train``'s checkpoint: its model keys load directly, and a trainer loaded from it scores
    the raw test images as the run did."""
    rc, out, err = run(capsys, "train", *LENET, "--epochs", "1", "--out", tmp_path / "run")
    assert rc == 0, err
    final = next(line for line in out.splitlines() if line.startswith("final test accuracy"))
    ckpt = tmp_path / "run" / "checkpoint.safetensors"
    net = lenet5(num_classes=10)
    net.load_state_dict(mdn.load(ckpt))
    trainer = mdn.load(ckpt, mdn.compile(net, (16, 1, 28, 28), nn.CrossEntropyLoss()))
    assert trainer.normalization is not None
    acc = mdn.evaluate(trainer, DataLoader(load("synthetic:1x28x28:classes=10:n=48", "test"), 16, shuffle=False))
    assert final == f"final test accuracy {acc * 100:.2f}%"
    rc, out, err = run(capsys, "eval", ckpt)
    assert rc == 0 and f"test accuracy {acc * 100:.2f}%" in out, err


def test_the_cli_resumes_a_first_format_checkpoint_exactly(tmp_path, capsys):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert run(capsys, "train", *LENET, "--epochs", "2", "--out", full)[0] == 0
    assert run(capsys, "train", *LENET, "--epochs", "1", "--out", cut)[0] == 0
    as_format_1(cut / "checkpoint.safetensors")
    rc, _, err = run(capsys, "train", "--resume", cut / "checkpoint.safetensors", "--epochs", "2", "--no-progress")
    assert rc == 0, err
    assert read_jsonl(cut / "steps.jsonl") == read_jsonl(full / "steps.jsonl")
    for name, a in mdn.load(full / "checkpoint.safetensors").items():
        np.testing.assert_array_equal(mdn.load(cut / "checkpoint.safetensors")[name], a, err_msg=name)


def test_eval_of_a_checkpoint_that_is_not_one_is_one_line(tmp_path, capsys):
    path = tmp_path / "new.safetensors"
    mdn.save(path, small_trainer())
    tensors, meta = load_checkpoint(path)
    save_checkpoint(path, tensors, {**meta, "format": 3})
    rc, _, err = run(capsys, "eval", path)
    assert rc == 2 and "newer minidnn" in one_line_error(err)


def test_fit_into_a_folder_holding_a_run_is_refused_and_loses_nothing(tmp_path):
    """Python's fit keeps the CLI's promise: a second fit into a folder holding a run is refused (its
    checkpoint and logs untouched, not appended to), continues it with resume= from its own checkpoint,
    replaces it with overwrite=True; while a fit runs, the folder is locked."""
    train = load("digits", "train", size=8)
    out = tmp_path / "run"

    def fit(**kwargs):
        trainer = small_trainer(small_net())
        return mdn.fit(trainer, DataLoader(train, 32), epochs=1, out_dir=out, progress=False,
                       log=lambda line: None, **kwargs)
    fit()
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"checkpoint.safetensors", "steps.jsonl", "metrics.jsonl"} <= set(files)
    with pytest.raises(mdn.ConfigError, match="holds a previous run"):
        fit()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert len(read_jsonl(out / "metrics.jsonl")) == 1
    fit(resume=out / "checkpoint.safetensors")          # epoch 1 of 1 done: nothing to add, nothing lost
    assert len(read_jsonl(out / "metrics.jsonl")) == 1
    fit(overwrite=True)
    assert len(read_jsonl(out / "metrics.jsonl")) == 1
    from minidnn.run_folder import RunFolder
    with RunFolder(out) as held:
        held.claim(out / "checkpoint.safetensors")
        with pytest.raises(mdn.ConfigError, match="in use"):
            fit(overwrite=True)
