"""``--precision`` on the command line (issue #27): train, resume with and without it, plan, models."""
import json

import numpy as np
import pytest

from minidnn import cli
from minidnn.training import load_checkpoint
from test_cli import LENET_ARGS, assert_same_checkpoint_tensors, interrupt_after, one_line_error, read_jsonl, run


@pytest.fixture(scope="module")
def bf16_full(tmp_path_factory):
    """An uninterrupted 2-epoch LeNet-5 run in bf16: its output folder."""
    out = tmp_path_factory.mktemp("bf16")
    assert cli.main(["train", *LENET_ARGS, "--precision", "bf16", "--out", str(out)]) == 0
    return out


def test_train_bf16_names_its_precision_and_keeps_fp32_master_weights(bf16_full):
    tensors, meta = load_checkpoint(bf16_full / "checkpoint.safetensors")
    assert meta["precision"] == "bf16" and meta["config"]["precision"] == "bf16"
    assert all(t.dtype == np.float32 for k, t in tensors.items() if not k.endswith("num_batches_tracked"))
    assert all(np.isfinite(s["loss"]) for s in read_jsonl(bf16_full / "steps.jsonl"))


def test_train_fp16_checkpoints_its_loss_scale(tmp_path, capsys):
    rc, out, err = run(capsys, "train", *LENET_ARGS, "--precision", "fp16", "--out", tmp_path)
    assert rc == 0, err
    assert "precision fp16" in out and "dynamic loss scaling" in out
    _, meta = load_checkpoint(tmp_path / "checkpoint.safetensors")
    assert meta["precision"] == "fp16" and meta["grad_scaler"]["scale"] > 0


def test_resume_without_precision_takes_the_checkpoints_and_repeats_the_run(bf16_full, tmp_path, capsys,
                                                                             monkeypatch):
    interrupt_after(monkeypatch, 4)                                    # epoch 2, batch 1
    rc, out, err = run(capsys, "train", *LENET_ARGS, "--precision", "bf16", "--out", tmp_path)
    assert rc == 130
    monkeypatch.undo()
    rc, out, err = run(capsys, "train", *LENET_ARGS, "--out", tmp_path, "--resume", tmp_path / "checkpoint.safetensors")
    assert rc == 0, err
    assert "precision bf16" in out and "warning" not in err
    assert read_jsonl(tmp_path / "steps.jsonl") == read_jsonl(bf16_full / "steps.jsonl")
    assert_same_checkpoint_tensors(tmp_path / "checkpoint.safetensors", bf16_full / "checkpoint.safetensors")
    assert load_checkpoint(tmp_path / "checkpoint.safetensors")[1]["precision"] == "bf16"


def test_resume_with_the_same_explicit_precision_repeats_the_run(bf16_full, tmp_path, capsys, monkeypatch):
    interrupt_after(monkeypatch, 4)
    assert run(capsys, "train", *LENET_ARGS, "--precision", "bf16", "--out", tmp_path)[0] == 130
    monkeypatch.undo()
    rc, out, err = run(capsys, "train", *LENET_ARGS, "--precision", "bf16", "--out", tmp_path, "--resume",
                       tmp_path / "checkpoint.safetensors")
    assert rc == 0, err
    assert "warning" not in err
    assert read_jsonl(tmp_path / "steps.jsonl") == read_jsonl(bf16_full / "steps.jsonl")


def test_resume_with_another_explicit_precision_changes_it_on_purpose_and_says_so(bf16_full, tmp_path, capsys):
    rc, out, err = run(capsys, "train", *LENET_ARGS, "--epochs", 3, "--precision", "fp32", "--out", tmp_path,
                       "--resume", bf16_full / "checkpoint.safetensors")
    assert rc == 0, err
    assert "precision 'bf16' -> 'fp32'" in err and "will not repeat the original" in err
    assert "precision bf16" not in out
    _, meta = load_checkpoint(tmp_path / "checkpoint.safetensors")
    assert meta["precision"] == "fp32" and meta["epoch"] == 3


def test_unknown_precision_is_refused_by_every_command(capsys):
    for argv in (["train", *LENET_ARGS], ["plan", "--model", "lenet5"], ["models"]):
        with pytest.raises(SystemExit) as e:
            cli.main([*argv, "--precision", "fp8"])
        assert e.value.code == 2
        assert "invalid choice: 'fp8'" in capsys.readouterr().err


def test_plan_precision_halves_the_activations_and_keeps_the_persistent_region(capsys):
    figures = {}
    for p in ("fp32", "bf16", "fp16"):
        rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--precision", p, "--json")
        assert rc == 0, err
        figures[p] = json.loads(out)
        assert figures[p]["precision"] == p
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--precision", "bf16")
    assert rc == 0 and "precision bf16:" in out and "fp32 master weights" in out
    for p in ("bf16", "fp16"):
        assert figures[p]["persistent_bytes"] == figures["fp32"]["persistent_bytes"]
        # 2-byte activations and their gradients (half of fp32's), plus the low copies of the weights:
        # 0.64 of fp32's peak here (persistent region included)
        assert figures[p]["liveness_peak_bytes"] < 0.7 * figures["fp32"]["liveness_peak_bytes"]
    assert figures["bf16"]["liveness_peak_bytes"] == figures["fp16"]["liveness_peak_bytes"]


def test_models_precision_reaches_every_row(capsys):
    """The activation-heavy CIFAR networks need less memory in bf16; every row is planned in it (weight-heavy
    ones at 32x32, as VGG's 100M-parameter classifier, need *more*: the 2-byte weight copies that their
    layers run on outweigh the activations saved, as torch.autocast's weight cast cache does)."""
    rows = {}
    for p in ("fp32", "bf16"):
        rc, out, err = run(capsys, "models", "--batch-size", 64, "--image-size", 32, "--precision", p, "--json")
        assert rc == 0, err
        rows[p] = {r["model"]: r for r in json.loads(out) if "error" not in r}
    assert rows["bf16"].keys() == rows["fp32"].keys() and len(rows["fp32"]) > 5
    for name, r in rows["bf16"].items():
        assert r["parameters"] == rows["fp32"][name]["parameters"], name
        assert r["liveness_peak_bytes"] != rows["fp32"][name]["liveness_peak_bytes"], name
    for name in ("resnet20", "resnet56", "resnet110", "densenet_small"):
        assert rows["bf16"][name]["liveness_peak_bytes"] < 0.8 * rows["fp32"][name]["liveness_peak_bytes"], name
