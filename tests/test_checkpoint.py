"""Checkpoint round trips, atomic writes, error reporting and state_dict import."""

import json
import os
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from minidnn.checkpoint import load_checkpoint, load_state_dict_file, restore_rng, rng_state, save_checkpoint
from minidnn.errors import CheckpointError


def assert_names(excinfo, path):
    message = str(excinfo.value)
    assert str(path) in message and "\n" not in message


def sample_tensors():
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    weights.reshape(-1)[0] = np.nan
    return {
        "conv.weight": weights,
        "conv.bias": rng.standard_normal(4).astype(np.float64),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
        "half": rng.standard_normal((2, 5)).astype(np.float16),
        "mask": np.array([True, False, True]),
        "empty": np.zeros((0, 3), np.float32),
        "strided": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2],
    }


def test_round_trip_bitwise(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = sample_tensors()
    meta = {"step": 12, "optimizer": {"lr": 0.1, "momentum": [0.9]}, "name": "résumé"}
    save_checkpoint(path, tensors, meta)
    loaded, loaded_meta = load_checkpoint(path)
    assert loaded_meta == meta
    assert set(loaded) == set(tensors)
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape
        assert loaded[name].tobytes() == value.tobytes()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_overwrite_replaces(tmp_path):
    path = tmp_path / "ckpt"
    save_checkpoint(path, {"a": np.zeros(2)}, {"v": 1})
    save_checkpoint(path, {"b": np.ones(3)}, {"v": 2})
    tensors, meta = load_checkpoint(path)
    assert meta == {"v": 2} and list(tensors) == ["b"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch, failing):
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, {"w": np.arange(4.0)}, {"step": 1})

    def crash(*args, **kwargs):
        raise OSError("simulated crash mid-write")

    monkeypatch.setattr(os, failing, crash)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(path, {"w": np.zeros(1000)}, {"step": 2})
    monkeypatch.undo()
    tensors, meta = load_checkpoint(path)
    assert meta == {"step": 1}
    np.testing.assert_array_equal(tensors["w"], np.arange(4.0))
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # the temp file was cleaned up


def test_bad_meta_rejected(tmp_path):
    path = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match="JSON") as excinfo:
        save_checkpoint(path, {}, {"x": object()})
    assert_names(excinfo, path)
    assert not path.exists()


def test_missing_file(tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointError, match="not found") as excinfo:
        load_checkpoint(path)
    assert_names(excinfo, path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "bad_header"])
def test_corrupt_or_truncated(tmp_path, damage):
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, sample_tensors(), {"step": 1})
    raw = path.read_bytes()
    path.write_bytes({
        "truncate": raw[: len(raw) - 17],
        "garbage": b"this is not a safetensors file at all",
        "empty": b"",
        "bad_header": raw[:8] + b"{not json" + raw[17:],
    }[damage])
    with pytest.raises(CheckpointError) as excinfo:
        load_checkpoint(path)
    assert_names(excinfo, path)


def test_safetensors_without_minidnn_metadata(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(path))
    with pytest.raises(CheckpointError, match="minidnn") as excinfo:
        load_checkpoint(path)
    assert_names(excinfo, path)


def test_flipped_data_byte_is_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    tensors = sample_tensors()
    save_checkpoint(path, tensors, {"step": 1})
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    begin, _ = json.loads(raw[8:8 + n])["conv.bias"]["data_offsets"]
    raw[8 + n + begin] ^= 0x01                   # the lowest bit of a float64's mantissa: a valid number still
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="tensor 'conv.bias' does not match its checksum") as excinfo:
        load_checkpoint(path)
    assert_names(excinfo, path)


def test_changed_metadata_and_removed_tensors_or_checksums_are_refused(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, {"a": np.arange(3.0), "b": np.ones(2)}, {"epoch": 3})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])

    def rewritten(edit):
        h = json.loads(json.dumps(header))
        edit(h)
        text = json.dumps(h).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
        with pytest.raises(CheckpointError) as excinfo:
            load_checkpoint(path)
        assert_names(excinfo, path)
        return str(excinfo.value)

    assert "metadata does not match its checksum" in \
        rewritten(lambda h: h["__metadata__"].update(minidnn='{"epoch": 4}'))
    assert "no 'minidnn.sha256' checksums" in rewritten(lambda h: h["__metadata__"].pop("minidnn.sha256"))
    save_file({"a": np.arange(3.0)}, str(path), metadata=header["__metadata__"])      # b dropped, as a tool would
    with pytest.raises(CheckpointError, match="tensor 'b' is missing") as excinfo:
        load_checkpoint(path)
    assert_names(excinfo, path)


def test_stale_temporary_files_are_removed_by_the_next_save(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, {"w": np.arange(4.0)}, {"step": 1})
    stale = [tmp_path / ".ckpt.safetensors.k1ll3d.tmp", tmp_path / ".ckpt.safetensors.x.tmp"]
    for p in stale:
        p.write_bytes(b"half a checkpoint")      # what a write killed before its rename leaves
    other = tmp_path / ".other.safetensors.y.tmp"
    other.write_bytes(b"another checkpoint's")
    save_checkpoint(path, {"w": np.arange(5.0)}, {"step": 2})
    assert sorted(os.listdir(tmp_path)) == sorted([".other.safetensors.y.tmp", "ckpt.safetensors"])
    assert load_checkpoint(path)[1] == {"step": 2}


# ---------------------------------------------------------------- state_dict import

def torch_like_state_dict():
    rng = np.random.default_rng(1)
    return {
        "conv1.weight": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "layer1.0.conv1.weight": rng.standard_normal((8, 8, 3, 3)).astype(np.float32),
        "layer1.0.bn1.running_mean": rng.standard_normal(8).astype(np.float32),
        "layer1.0.bn1.num_batches_tracked": np.array(3, np.int64),
        "fc.bias": rng.standard_normal(10).astype(np.float32),
    }


def assert_state_equal(a, b):
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype
        np.testing.assert_array_equal(a[key], b[key])


def test_import_npz(tmp_path):
    path = tmp_path / "resnet.npz"
    state = torch_like_state_dict()
    np.savez(path, **state)
    assert_state_equal(load_state_dict_file(path), state)


def test_import_safetensors(tmp_path):
    path = tmp_path / "resnet.safetensors"
    state = torch_like_state_dict()
    save_file(state, str(path), metadata={"format": "pt"})
    assert_state_equal(load_state_dict_file(path), state)


def test_import_bfloat16_safetensors(tmp_path):
    values = np.array([[1.0, -2.5], [0.15625, 2.0 ** 100]], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")  # these values are exact in bfloat16
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bf16.tobytes() + np.float32(4).tobytes())
    state = load_state_dict_file(path)
    np.testing.assert_array_equal(state["w"], values)
    assert state["w"].dtype == np.float32 and state["b"].tolist() == [4.0]


@pytest.mark.parametrize("name,content", [("w.npz", b"PK\x03\x04 broken zip"), ("w.safetensors", b"junk" * 5),
                                          ("w.pt", b"whatever")])
def test_import_errors(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as excinfo:
        load_state_dict_file(path)
    assert_names(excinfo, path)


def test_import_missing_and_pickled_npz(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_state_dict_file(tmp_path / "missing.npz")
    path = tmp_path / "objects.npz"
    np.savez(path, w=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError) as excinfo:
        load_state_dict_file(path)
    assert_names(excinfo, path)


# ---------------------------------------------------------------- RNG state

@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.MT19937, np.random.Philox, np.random.SFC64])
def test_rng_round_trip_through_json(bit_generator):
    gen = np.random.Generator(bit_generator(123))
    gen.random(5)
    state = json.loads(json.dumps(rng_state(gen)))
    restored = restore_rng(state)
    np.testing.assert_array_equal(restored.random(10), gen.random(10))
    np.testing.assert_array_equal(restored.integers(0, 100, 10), gen.integers(0, 100, 10))


def test_rng_state_in_checkpoint_meta(tmp_path):
    gen = np.random.default_rng(9)
    path = tmp_path / "ckpt"
    save_checkpoint(path, {}, {"rng": rng_state(gen)})
    _, meta = load_checkpoint(path)
    assert restore_rng(meta["rng"]).random() == gen.random()


def test_restore_rng_rejects_unknown():
    with pytest.raises(CheckpointError):
        restore_rng({"bit_generator": "Generator"})
    with pytest.raises(CheckpointError):
        restore_rng({"bit_generator": "PCG64", "state": "nonsense"})


# ---------------------------------------------------------------- training checkpoints: resume

RESNET = ["--model", "resnet20", "--data", "synthetic:3x8x8:classes=4:n=16", "--batch-size", "8", "--no-progress"]
LENET = ["--model", "lenet5", "--data", "synthetic:1x28x28:classes=10:n=16", "--batch-size", "8", "--epochs", "1",
         "--no-progress"]


def train(capsys, *argv):
    from minidnn import cli
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def error_line(err):
    """The error: the last line of stderr, after any warning."""
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("minidnn: error: ") and all("error" not in x for x in lines[:-1]), err
    return lines[-1]


def steps(folder):
    with open(folder / "steps.jsonl") as f:
        return [json.loads(line) for line in f]


def test_resume_takes_the_model_and_data_settings_from_the_checkpoint(tmp_path, capsys):
    """The README's `minidnn train --resume runs/latest/checkpoint.safetensors`, for a ResNet-20 run."""
    full, part = tmp_path / "full", tmp_path / "part"
    assert train(capsys, "train", *RESNET, "--epochs", "2", "--out", full)[0] == 0
    assert train(capsys, "train", *RESNET, "--epochs", "1", "--out", part)[0] == 0
    ckpt = part / "checkpoint.safetensors"
    rc, out, err = train(capsys, "train", "--resume", ckpt, "--out", part)      # nothing given but the file
    assert rc == 0, err
    assert "resnet20" in out and "nothing to do: the checkpoint has finished epoch 1 of --epochs 1" in out
    assert "warning" not in err
    rc, out, err = train(capsys, "train", "--resume", ckpt, "--epochs", "2", "--out", part, "--no-progress")
    assert rc == 0, err
    assert "warning: epochs 1 -> 2" in err                   # the only setting given, and the only one changed
    assert steps(part) == steps(full)                        # the data, batch size, seed, optimizer: the run's


@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory):
    from minidnn import cli
    out = tmp_path_factory.mktemp("lenet")
    assert cli.main(["train", *LENET, "--out", str(out)]) == 0
    return out / "checkpoint.safetensors"


def test_resume_without_optimizer_state_is_refused_unless_reset_on_purpose(lenet_run, tmp_path, capsys):
    tensors, meta = load_checkpoint(lenet_run)
    assert any(k.startswith("optim.") for k in tensors)
    bare = tmp_path / "bare.safetensors"
    save_checkpoint(bare, {k: v for k, v in tensors.items() if not k.startswith("optim.")}, meta)
    rc, _, err = train(capsys, "train", "--resume", bare, "--epochs", "2", "--out", tmp_path / "a")
    line = error_line(err)
    assert rc == 2 and str(bare) in line and "incomplete optimizer state: optim." in line
    assert "momentum_buffer" in line and "--reset-optimizer" in line
    rc, out, err = train(capsys, "train", "--resume", bare, "--epochs", "2", "--reset-optimizer",
                         "--out", tmp_path / "b")
    assert rc == 0, err
    assert "epoch   2/2" in out


def test_reset_optimizer_restarts_the_state_as_a_fresh_optimizer(lenet_run):
    """Adam after a reset: zero moments, and the bias correction of a first step (not of step 3)."""
    import minidnn
    from minidnn import nn, optim
    from minidnn.models import lenet5
    from minidnn.training import read_checkpoint, restore

    def trainer():
        net = lenet5(num_classes=10)
        return minidnn.compile(net, (8, 1, 28, 28), nn.CrossEntropyLoss(), optim.Adam(lr=0.01)), net

    ckpt = read_checkpoint(lenet_run)
    ckpt.meta.update(optimizer_type="Adam", optimizer=optim.Adam(lr=0.01).state_dict())
    reset, net_r = trainer()
    restore(ckpt, reset, None, "lenet5", reset_optimizer=True)
    fresh, net_f = trainer()
    net_f.load_state_dict(minidnn.load(lenet_run))          # the checkpoint's model keys are the state_dict's
    fresh.normalization = reset.normalization                # the checkpoint's, which restore set
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 8)
    assert reset.steps_done == ckpt.meta["steps_done"] > 0
    assert reset.step(x, y) == fresh.step(x, y)
    for (k, a), b in zip(net_r.state_dict().items(), net_f.state_dict().values()):
        np.testing.assert_array_equal(a, b, err_msg=k)


def test_a_batch_index_past_the_end_of_the_epoch_is_one_line(lenet_run, tmp_path, capsys):
    tensors, meta = load_checkpoint(lenet_run)
    path = tmp_path / "late.safetensors"
    save_checkpoint(path, tensors, {**meta, "epoch": 0, "batch": 9})
    rc, _, err = train(capsys, "train", "--resume", path, "--out", tmp_path)
    line = error_line(err)
    assert rc == 2 and str(path) in line and "batch 9" in line and "past the end" in line and "2 batches" in line


def test_hyperparameters_given_on_resume_win_over_the_checkpoint(lenet_run, tmp_path, capsys):
    rc, out, err = train(capsys, "train", "--resume", lenet_run, "--epochs", "2", "--lr", "0.5", "--out", tmp_path)
    assert rc == 0, err
    assert "lr 0.05 -> 0.5" in err
    # cosine over 2 epochs from the given initial lr: epoch 2 runs at half of it
    assert {s["lr"] for s in steps(tmp_path) if s["epoch"] == 2} == {0.25}


def test_restore_into_an_optimizer_keeping_other_state_is_refused(lenet_run):
    import minidnn
    from minidnn import nn, optim
    from minidnn.models import lenet5
    from minidnn.training import restore
    trainer = minidnn.compile(lenet5(num_classes=10), (8, 1, 28, 28), nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    with pytest.raises(CheckpointError, match=r"keeps state \('momentum_buffer',\), the trainer's \(\)") as e:
        restore(lenet_run, trainer, None, "lenet5")
    assert_names(e, lenet_run)
