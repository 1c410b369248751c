"""The ``minidnn`` command: models, plan, train (checkpoint, Ctrl-C, exact resume), eval, info, bad input.

Commands run in-process through ``minidnn.cli.main`` (one test runs the
console script itself). Training uses tiny synthetic data so the whole file
takes well under a minute on two cores.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from minidnn import cli, models
from minidnn.checkpoint import load_checkpoint
from minidnn.memory.policies import POLICIES
from minidnn.trainer import Trainer

RESNET_DATA = "synthetic:3x32x32:classes=10:n=40"          # 16 + 16 + 8: a partial last batch too
RESNET_ARGS = ["--model", "resnet20", "--data", RESNET_DATA, "--epochs", "2", "--batch-size", "16",
               "--augment", "crop+flip", "--no-progress"]
LENET_ARGS = ["--model", "lenet5", "--data", "synthetic:1x28x28:classes=10:n=48", "--epochs", "2",
              "--batch-size", "16", "--no-progress"]


def run(capsys, *argv):
    """(exit status, stdout, stderr) of ``minidnn argv`` run in this process."""
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minidnn: error: "), err
    return lines[0]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_same_checkpoint_tensors(a, b):
    ta, _ = load_checkpoint(a)
    tb, _ = load_checkpoint(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)


def interrupt_after(monkeypatch, k, how="raise"):
    """Make the (k+1)-th training step be interrupted: ``raise`` KeyboardInterrupt before it runs,
    or send a real SIGINT to this process from inside it (which the loop must defer to the step's end)."""
    original, calls = Trainer.step, []

    def step(self, x, y):
        calls.append(1)
        if len(calls) == k + 1:
            if how == "raise":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)           # let the handler run while the step is in flight
        return original(self, x, y)

    monkeypatch.setattr(Trainer, "step", step)
    return calls


# ---------------------------------------------------------------- models and plan

def test_models_table_every_model_in_seconds_without_kernels(capsys, monkeypatch):
    from minidnn.executor import Executor

    def no_kernels(*a, **k):
        raise AssertionError("a kernel ran")
    monkeypatch.setattr(Executor, "run", no_kernels)
    t0 = time.process_time()         # CPU time: other processes on a busy machine do not count
    rc, out, err = run(capsys, "models", "--batch-size", 256, "--image-size", 224)
    elapsed = time.process_time() - t0
    assert rc == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == set(models.names()) - {"resnet_deep"}
    for name, line in rows.items():
        assert "GiB" in line and "size:" not in line, line         # every model takes 224
    assert "138.36M" in rows["vgg16"]
    assert elapsed < 30, f"models table took {elapsed:.1f} s of CPU time"
    from minidnn.nn import Conv2d
    from minidnn.report import _noop
    assert Conv2d.reset_parameters is not _noop                   # weights are drawn again afterwards


def test_models_rows_give_a_reason_for_sizes_a_network_cannot_take():
    from minidnn.report import model_row
    alex = model_row("alexnet", 2, 32)
    assert "error" in alex and "ideal_bytes" not in alex
    unet = model_row("unet", 1, 30)                                # not divisible by 2**4
    assert "divisible" in unet["error"]
    ok = model_row("unet", 1, 64)                                  # per-pixel output: an MSE loss is used
    assert ok["ideal_bytes"] > ok["liveness_peak_bytes"] >= ok["lower_bound_bytes"] > 0


def test_plan_prints_figures_decisions_and_prediction(capsys):
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--budget", "0.6")
    assert rc == 0, err
    for word in ("ideal", "liveness peak", "lower bound", "plan peak", "evicted tensors", "predicted step time",
                 "overhead", "no plan within this budget is predicted faster than"):
        assert word in out
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--budget", "0.6", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["peak_bytes"] <= d["budget_bytes"] < d["liveness_peak_bytes"] <= d["ideal_bytes"]
    assert d["lower_bound_bytes"] <= d["peak_bytes"]
    assert d["decisions"] and {x["decision"] for x in d["decisions"]} <= {"offload", "recompute"}
    assert d["prediction"]["step_seconds"] >= d["prediction"]["unlimited_memory_seconds"] > 0
    # the floor under every plan within the budget (memory/bound.py): between the two
    assert d["prediction"]["unlimited_memory_seconds"] <= d["prediction"]["floor_seconds"] \
        <= d["prediction"]["step_seconds"]
    assert d["profile"] == "titanx-12gb"


def test_plan_vgg16_batch_256_runs_in_seconds(capsys):
    t0 = time.process_time()
    rc, out, err = run(capsys, "plan", "--model", "vgg16", "--batch-size", 256, "--image-size", 224,
                       "--budget", "12GiB", "--profile", "titanx-12gb", "--json")
    assert time.process_time() - t0 < 10
    d = json.loads(out)
    if rc == 0:
        assert d["peak_bytes"] <= 12 * 2**30
    else:   # a budget below what the planner reaches: the minimum, on one line
        assert rc == 2 and d["minimum_bytes"] > 12 * 2**30
        assert "minimum" in one_line_error(err)


def test_plan_budget_below_the_minimum_is_one_line(capsys):
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 8, "--budget", "1MiB")
    assert rc == 2 and "minimum" in one_line_error(err)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_plan_takes_every_policy_by_name(capsys, policy):
    """Every policy the library has, the papers' included, is selectable by name: a plan that fits,
    or the one-line error with a minimum."""
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--budget", "0.7", "--json",
                       "--policy", policy, "--sub-batching", "off")
    d = json.loads(out)
    if rc == 0:
        assert d["policy"] == policy
        assert d["peak_bytes"] <= d["budget_bytes"]
    else:
        assert rc == 2 and d["minimum_bytes"] > 0 and policy in d["error"]


def test_policy_none_below_its_peak_says_so_at_once(capsys):
    """No policy evicts nothing and splits nothing: under its peak, the error names that peak (above
    the budget), not a "minimum feasible" below it, and no split is searched."""
    t0 = time.process_time()
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--budget", "0.25",
                       "--policy", "none")
    line = one_line_error(err)
    assert rc == 2 and "policy 'none' evicts nothing" in line and "above the budget" in line
    assert time.process_time() - t0 < 10


def test_a_split_plan_reports_its_overhead_against_the_unsplit_step(capsys):
    """Below the full batch's minimum the step is split; --json's prediction compares it with the
    unsplit step with unlimited memory (the step it stands for), as the text does."""
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--json")
    assert rc == 0, err
    whole = json.loads(out)
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--json",
                       "--budget", str(whole["lower_bound_bytes"] - 1))
    assert rc == 0, err
    d = json.loads(out)
    assert d["sub_batches"] > 1
    pred = d["prediction"]
    assert pred["unlimited_memory_seconds"] == whole["prediction"]["step_seconds"]
    assert pred["overhead"] == pytest.approx(pred["step_seconds"] / pred["unlimited_memory_seconds"] - 1)
    assert pred["overhead"] > 0


# ---------------------------------------------------------------- train, interrupt, resume, eval

@pytest.fixture(scope="module")
def resnet_full(tmp_path_factory):
    """An uninterrupted 2-epoch ResNet-20 run: its output folder."""
    out = tmp_path_factory.mktemp("full")
    assert cli.main(["train", *RESNET_ARGS, "--out", str(out)]) == 0
    return out


def test_train_writes_checkpoint_metrics_and_steps(resnet_full):
    steps = read_jsonl(resnet_full / "steps.jsonl")
    assert [(s["epoch"], s["batch"], s["step"]) for s in steps] == [(1, 0, 1), (1, 1, 2), (1, 2, 3),
                                                                     (2, 0, 4), (2, 1, 5), (2, 2, 6)]
    assert all(np.isfinite(s["loss"]) for s in steps)
    metrics = read_jsonl(resnet_full / "metrics.jsonl")
    assert [m["epoch"] for m in metrics] == [1, 2] and metrics[0]["peak_bytes"] > 0
    _, meta = load_checkpoint(resnet_full / "checkpoint.safetensors")
    assert (meta["model"], meta["epoch"], meta["batch"], meta["steps_done"]) == ("resnet20", 2, 0, 6)


def test_interrupted_and_resumed_run_repeats_the_uninterrupted_one(resnet_full, tmp_path, capsys, monkeypatch):
    calls = interrupt_after(monkeypatch, 4)                       # epoch 2, batch 1
    rc, out, err = run(capsys, "train", *RESNET_ARGS, "--out", tmp_path)
    assert rc == 130 and len(calls) == 5
    assert "--resume" in err
    _, meta = load_checkpoint(tmp_path / "checkpoint.safetensors")
    assert (meta["epoch"], meta["batch"], meta["steps_done"]) == (1, 1, 4)
    monkeypatch.undo()
    rc, out, err = run(capsys, "train", *RESNET_ARGS, "--out", tmp_path, "--resume",
                       tmp_path / "checkpoint.safetensors")
    assert rc == 0, err
    assert read_jsonl(tmp_path / "steps.jsonl") == read_jsonl(resnet_full / "steps.jsonl")
    drop = lambda ms: [{k: v for k, v in m.items() if k != "seconds"} for m in ms]  # noqa: E731
    assert drop(read_jsonl(tmp_path / "metrics.jsonl")) == drop(read_jsonl(resnet_full / "metrics.jsonl"))
    assert_same_checkpoint_tensors(tmp_path / "checkpoint.safetensors", resnet_full / "checkpoint.safetensors")


@pytest.fixture
def ctrl_c_live():
    """Ctrl-C raising KeyboardInterrupt, as in a terminal (a background job of a non-interactive
    shell starts with SIGINT ignored, which the training loop respects)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_is_deferred_to_the_end_of_the_step(tmp_path, capsys, monkeypatch, ctrl_c_live):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert run(capsys, "train", *LENET_ARGS, "--out", full)[0] == 0
    interrupt_after(monkeypatch, 2, how="signal")                 # SIGINT arrives during step 3, the last of epoch 1
    rc, out, err = run(capsys, "train", *LENET_ARGS, "--out", cut)
    assert rc == 130
    _, meta = load_checkpoint(cut / "checkpoint.safetensors")
    assert (meta["epoch"], meta["batch"], meta["steps_done"]) == (0, 3, 3)   # step 3 finished and counts
    assert not (cut / "metrics.jsonl").exists()                 # stopped before the epoch's evaluation
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler     # the handler is removed
    monkeypatch.undo()
    rc, out, err = run(capsys, "train", *LENET_ARGS, "--out", cut, "--resume", cut / "checkpoint.safetensors")
    assert rc == 0, err
    assert read_jsonl(cut / "steps.jsonl") == read_jsonl(full / "steps.jsonl")
    assert [m["test_accuracy"] for m in read_jsonl(cut / "metrics.jsonl")] == \
        [m["test_accuracy"] for m in read_jsonl(full / "metrics.jsonl")]
    assert_same_checkpoint_tensors(cut / "checkpoint.safetensors", full / "checkpoint.safetensors")


def test_eval_reports_the_accuracy_of_the_checkpoint(resnet_full, capsys):
    rc, out, err = run(capsys, "eval", resnet_full / "checkpoint.safetensors")
    assert rc == 0, err
    final = read_jsonl(resnet_full / "metrics.jsonl")[-1]["test_accuracy"]
    assert f"test accuracy {final * 100:.2f}%" in out


# ---------------------------------------------------------------- bad input

@pytest.fixture(scope="module")
def lenet_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("lenet")
    argv = ["train", "--model", "lenet5", "--data", "synthetic:3x32x32:n=16", "--epochs", "1", "--batch-size", "16",
            "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    return out / "checkpoint.safetensors"


def write_idx(path, dims, payload_bytes):
    header = bytes([0, 0, 8, len(dims)]) + b"".join(int(d).to_bytes(4, "big") for d in dims)
    path.write_bytes(header + bytes(payload_bytes))


def test_missing_dataset_file(capsys):
    rc, _, err = run(capsys, "train", "--data", "mnist:/nonexistent", "--no-progress")
    assert rc == 2 and "missing file /nonexistent/train-images-idx3-ubyte" in one_line_error(err)


def test_truncated_dataset_file(tmp_path, capsys):
    write_idx(tmp_path / "train-images-idx3-ubyte", (10, 28, 28), 10 * 28 * 28 - 100)
    write_idx(tmp_path / "train-labels-idx1-ubyte", (10,), 10)
    rc, _, err = run(capsys, "train", "--data", f"mnist:{tmp_path}", "--no-progress", "--out", tmp_path / "o")
    assert rc == 2 and "truncated" in one_line_error(err)


def test_checkpoint_of_another_model(lenet_checkpoint, tmp_path, capsys):
    rc, _, err = run(capsys, "eval", lenet_checkpoint, "--model", "resnet20", "--data", "synthetic:3x32x32:n=16")
    assert rc == 2 and "for model 'lenet5', not 'resnet20'" in one_line_error(err)
    rc, _, err = run(capsys, "train", "--model", "resnet20", "--data", "synthetic:3x32x32:n=16", "--no-progress",
                     "--resume", lenet_checkpoint, "--out", tmp_path)
    assert rc == 2 and "for model 'lenet5', not 'resnet20'" in one_line_error(err)


def test_missing_or_corrupt_checkpoint(tmp_path, capsys):
    rc, _, err = run(capsys, "eval", tmp_path / "none.safetensors")
    assert rc == 2 and "not found" in one_line_error(err)
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    rc, _, err = run(capsys, "eval", tmp_path / "bad.safetensors")
    assert rc == 2 and "bad.safetensors" in one_line_error(err)


def test_unknown_model_suggests_close_names(capsys):
    rc, _, err = run(capsys, "train", "--model", "resnet19", "--data", "synthetic:3x32x32:n=16", "--no-progress")
    line = one_line_error(err)
    assert rc == 2 and "unknown model 'resnet19'" in line and "did you mean" in line and "'resnet18'" in line
    rc, _, err = run(capsys, "plan", "--model", "vgg15")
    assert rc == 2 and "'vgg16'" in one_line_error(err)


def test_image_size_the_network_cannot_take(tmp_path, capsys):
    rc, _, err = run(capsys, "train", "--model", "alexnet", "--data", "synthetic:3x32x32:n=16", "--no-progress",
                     "--out", tmp_path)
    assert rc == 2 and "features" in one_line_error(err)       # names the layer that cannot take it


def test_bad_budget_and_device(tmp_path, capsys):
    rc, _, err = run(capsys, "plan", "--model", "resnet20", "--budget", "lots")
    assert rc == 2 and "lots" in one_line_error(err)
    rc, _, err = run(capsys, "train", "--data", "synthetic:1x28x28:n=16", "--device", "cuda", "--no-progress",
                     "--out", tmp_path)
    assert rc == 2 and "cuda" in one_line_error(err)


def test_console_script(tmp_path):
    exe = shutil.which("minidnn", path=os.path.dirname(sys.executable)) or shutil.which("minidnn")
    if exe is None:
        pytest.skip("the minidnn console script is not installed")
    p = subprocess.run([exe, "train", "--model", "resnet19"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert "did you mean" in one_line_error(p.stderr)


# ---------------------------------------------------------------- info

def test_info_lists_versions_and_backends(capsys):
    rc, out, _ = run(capsys, "info")
    assert rc == 0
    assert "numpy" in out and "python" in out and "cpu backend" in out and "cuda backend" in out
    assert "cuDNN" in out and "torch" in out
    from minidnn import _C
    assert ("no implicit convolutions" in out) != _C.conv2d_implicit_available()


def test_train_sub_batching_choices_reach_the_memory_config(capsys, tmp_path):
    """--sub-batching off refuses a budget that only a split meets (naming the minimum); the
    other choices split and train."""
    args = [*LENET_ARGS, "--epochs", "1", "--budget", "0.7"]
    rc, _, err = run(capsys, "train", *args, "--sub-batching", "off", "--out", tmp_path / "off")
    assert rc != 0 and "minimum feasible" in err
    for choice in ("needed", "fastest"):
        rc, out, _ = run(capsys, "train", *args, "--sub-batching", choice, "--out", tmp_path / choice)
        assert rc == 0 and "sub-batches" in out
