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
