"""Fault injection: corrupt checkpoints, traces and data files, and checkpoint writers killed with SIGKILL.

A damaged file is either refused with a ``minidnn.errors`` error naming it, or
read back exactly as it was written (a change that leaves the content as it
was, e.g. a gzip header's timestamp); never a traceback of another type,
never different content accepted in silence.
"""
import gzip
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minidnn import trace as T
from minidnn.checkpoint import load_checkpoint, save_checkpoint
from minidnn.data import load_mnist
from minidnn.errors import CheckpointError, DataError, MinidnnError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def checkpoint_bytes(tmp_path_factory):
    rng = np.random.default_rng(0)
    tensors = {"model.conv.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
               "model.bn.num_batches_tracked": np.array(3, dtype=np.int64),
               "optim.conv.weight.momentum_buffer": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
               "model.fc.bias": rng.standard_normal(5).astype(np.float64)}
    meta = {"model": "toy", "epoch": 2, "batch": 7, "steps_done": 31, "optimizer": {"lr": 0.1}}
    path = tmp_path_factory.mktemp("ckpt") / "good.safetensors"
    save_checkpoint(path, tensors, meta)
    return path.read_bytes(), tensors, meta


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    return checkpoint_bytes(tmp_path_factory)


def read_back_checkpoint(path, tensors, meta):
    """The checkpoint at ``path`` is refused naming it, or it reads back exactly as written."""
    try:
        got, got_meta = load_checkpoint(path)
    except CheckpointError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return False
    assert got_meta == meta and sorted(got) == sorted(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes()
    return True


@FUZZ
@given(data=st.data())
def test_checkpoint_with_flipped_bytes(good_checkpoint, tmp_path, data):
    raw, tensors, meta = good_checkpoint
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        damaged[at] ^= data.draw(st.integers(1, 255))
    path = tmp_path / "flipped.safetensors"
    path.write_bytes(bytes(damaged))
    read_back_checkpoint(path, tensors, meta)


def test_a_flipped_byte_in_every_tensor_names_that_tensor(good_checkpoint, tmp_path):
    raw, tensors, meta = good_checkpoint
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    for name in tensors:
        begin, end = header[name]["data_offsets"]
        damaged = bytearray(raw)
        damaged[8 + n + (begin + end) // 2] ^= 0x10
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointError, match=f"tensor '{name}' does not match its checksum") as e:
            load_checkpoint(path)
        assert str(path) in str(e.value)


@FUZZ
@given(cut=st.integers(0, 10_000))
def test_truncated_checkpoint(good_checkpoint, tmp_path, cut):
    raw, tensors, meta = good_checkpoint
    path = tmp_path / "cut.safetensors"
    path.write_bytes(raw[:cut % len(raw)])
    assert not read_back_checkpoint(path, tensors, meta)


def rewrite_header(raw, edit):
    """The safetensors file ``raw`` with ``edit`` applied to its JSON header (data kept, offsets as they were)."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


@FUZZ
@given(data=st.data())
def test_checkpoint_with_fields_removed(good_checkpoint, tmp_path, data):
    raw, tensors, meta = good_checkpoint
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    removable = [("tensor", k) for k in header if k != "__metadata__"] + \
        [("metadata", k) for k in header["__metadata__"]] + \
        [("meta", k) for k in meta] + [("checksum", k) for k in json.loads(header["__metadata__"]["minidnn.sha256"])]
    chosen = data.draw(st.lists(st.sampled_from(removable), min_size=1, max_size=3, unique=True))

    def edit(h):
        meta_doc = json.loads(h["__metadata__"].get("minidnn", "{}"))
        sums = json.loads(h["__metadata__"].get("minidnn.sha256", "{}"))
        for where, key in chosen:
            {"tensor": h, "metadata": h["__metadata__"], "meta": meta_doc, "checksum": sums}[where].pop(key, None)
        if "minidnn" in h["__metadata__"]:
            h["__metadata__"]["minidnn"] = json.dumps(meta_doc)
        if "minidnn.sha256" in h["__metadata__"]:
            h["__metadata__"]["minidnn.sha256"] = json.dumps(sums)

    path = tmp_path / "removed.safetensors"
    path.write_bytes(rewrite_header(raw, edit))
    assert not read_back_checkpoint(path, tensors, meta)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=6)


@pytest.fixture(scope="module")
def training_checkpoint(tmp_path_factory):
    from minidnn import cli
    out = tmp_path_factory.mktemp("run")
    assert cli.main(["train", "--model", "lenet5", "--data", "synthetic:1x28x28:n=8", "--batch-size", "4",
                     "--epochs", "1", "--no-progress", "--out", str(out)]) == 0
    return load_checkpoint(out / "checkpoint.safetensors")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_resume_from_a_checkpoint_with_a_field_changed_or_removed(training_checkpoint, tmp_path, capsys, data):
    """Written whole (its checksums agree) but by another tool: resuming ends in one line, never a traceback."""
    from minidnn import cli
    tensors, meta = training_checkpoint
    meta = json.loads(json.dumps(meta))
    key = data.draw(st.sampled_from(sorted(meta)))
    inner = meta[key] if isinstance(meta[key], dict) and meta[key] and data.draw(st.booleans()) else None
    target, key = (inner, data.draw(st.sampled_from(sorted(inner)))) if inner else (meta, key)
    if data.draw(st.booleans()):
        target.pop(key)
    else:
        target[key] = data.draw(JSON)
    path = tmp_path / "changed.safetensors"
    save_checkpoint(path, tensors, meta)
    capsys.readouterr()
    out = tempfile.mkdtemp(dir=tmp_path)           # each example's own: a folder holding a run is refused
    rc = cli.main(["train", "--resume", str(path), "--no-progress", "--out", out])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc in (0, 2)
    if rc == 2:
        assert err[-1].startswith("minidnn: error: ") and not any("Traceback" in line for line in err)


# ---------------------------------------------------------------- traces

@pytest.fixture(scope="module")
def good_trace(tmp_path_factory):
    from test_trace import fake_trace
    trace = fake_trace()
    path = tmp_path_factory.mktemp("trace") / "good.json"
    trace.save(path)
    return path.read_bytes(), trace


def read_back_trace(path, trace):
    try:
        got = T.load(path)
    except T.TraceError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return False
    assert got == trace
    return True


@FUZZ
@given(data=st.data())
def test_trace_with_flipped_bytes(good_trace, tmp_path, data):
    raw, trace = good_trace
    start = raw.index(b'"format"')          # minidnn's part: load reads nothing of the Chrome events before it
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(start, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    path = tmp_path / "flipped.json"
    path.write_bytes(bytes(damaged))
    read_back_trace(path, trace)


@FUZZ
@given(at=st.integers(0, 10**6), xor=st.integers(1, 255), cut=st.integers(0, 10**6))
def test_gzipped_trace_flipped_or_truncated(good_trace, tmp_path, at, xor, cut):
    raw, trace = good_trace
    packed = bytearray(gzip.compress(raw))
    packed[at % len(packed)] ^= xor
    path = tmp_path / "flipped.json.gz"
    path.write_bytes(bytes(packed))
    read_back_trace(path, trace)
    path.write_bytes(gzip.compress(raw)[:cut % len(packed)])
    assert not read_back_trace(path, trace)


@FUZZ
@given(data=st.data())
def test_trace_with_fields_or_events_removed(good_trace, tmp_path, data):
    raw, trace = good_trace
    doc = json.loads(raw)
    own = doc["minidnn"]
    lists = [k for k in ("spans", "mem_events", "persistent", "planned") if own[k]]
    what = data.draw(st.sampled_from(["top", "field"] + lists))
    if what == "top":
        doc.pop(data.draw(st.sampled_from(["format", "version", "minidnn", "sha256"])))
    elif what == "field":
        own.pop(data.draw(st.sampled_from(sorted(own))))
    else:
        rows = own[what]
        drop = data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, unique=True))
        own[what] = [r for i, r in enumerate(rows) if i not in drop]
    path = tmp_path / "removed.json"
    path.write_text(json.dumps(doc))
    assert not read_back_trace(path, trace)


# ---------------------------------------------------------------- data files

def idx(dims, payload):
    return bytes([0, 0, 8, len(dims)]) + b"".join(int(d).to_bytes(4, "big") for d in dims) + bytes(payload)


@pytest.fixture(scope="module")
def mnist_files():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 6, dtype=np.uint8)
    return {"train-images-idx3-ubyte": idx(images.shape, images.tobytes()),
            "train-labels-idx1-ubyte": idx(labels.shape, labels.tobytes())}, images, labels


def read_back_mnist(root, images, labels, damaged):
    try:
        ds = load_mnist(str(root), "train")
    except DataError as e:
        assert damaged in str(e) and "\n" not in str(e)
        return False
    np.testing.assert_array_equal(ds.images[:, 0], images / np.float32(255.0))
    np.testing.assert_array_equal(ds.labels, labels)
    return True


@FUZZ
@given(data=st.data())
def test_mnist_headers_flipped_or_files_truncated(mnist_files, tmp_path, data):
    """Raw IDX has no checksum: a flipped pixel cannot be seen, so flips go to the header; cuts anywhere."""
    files, images, labels = mnist_files
    name = data.draw(st.sampled_from(sorted(files)))
    for other, content in files.items():
        (tmp_path / other).write_bytes(content)
    raw = bytearray(files[name])
    if data.draw(st.booleans()):
        header = 4 + 4 * raw[3]
        raw[data.draw(st.integers(0, header - 1))] ^= data.draw(st.integers(1, 255))
    else:
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    (tmp_path / name).write_bytes(bytes(raw))
    assert not read_back_mnist(tmp_path, images, labels, name)


@FUZZ
@given(data=st.data())
def test_gzipped_mnist_flipped_anywhere(mnist_files, tmp_path, data):
    """gzip carries a CRC-32 and the length: a flip anywhere is refused or changes nothing (the mtime field)."""
    files, images, labels = mnist_files
    name = data.draw(st.sampled_from(sorted(files)))
    for other, content in files.items():
        (tmp_path / (other + ".gz")).write_bytes(gzip.compress(content, mtime=0))
    raw = bytearray(gzip.compress(files[name], mtime=0))
    raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    (tmp_path / (name + ".gz")).write_bytes(bytes(raw))
    read_back_mnist(tmp_path, images, labels, name)


# ---------------------------------------------------------------- kill -9 while writing checkpoints

WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from minidnn.checkpoint import save_checkpoint
    path, start = sys.argv[1], int(sys.argv[2])
    for i in range(start, start + 10**6):
        save_checkpoint(path, {"w": np.full(1 << 21, i, dtype=np.float64)}, {"i": i})
        print(i, flush=True)          # i is on disk, complete
""")


def test_kill_9_during_checkpoint_writes_keeps_the_previous_checkpoint(tmp_path):
    """A writer saving in a loop is killed at random times: the last completed checkpoint always loads
    whole, and the next save leaves no temporary file of the killed writes."""
    path = tmp_path / "ckpt.safetensors"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(0)
    last, stale_seen = -1, 0
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, str(script), str(path), str(last + 1)], stdout=subprocess.PIPE,
                                text=True)
        first = proc.stdout.readline()                  # one save done: there is a previous checkpoint
        assert first, "the writer died before its first save"
        if rng.random() < 0.5:                          # at a random time ...
            time.sleep(rng.uniform(0.0, 0.1))
        else:                                           # ... or while a write is under way
            while not any(p.endswith(".tmp") for p in os.listdir(tmp_path)):
                pass
            time.sleep(rng.uniform(0.0, 0.002))
        proc.kill()
        proc.wait()
        done = [int(first)] + [int(line) for line in proc.stdout.read().split()]
        proc.stdout.close()
        tensors, meta = load_checkpoint(path)
        assert meta["i"] in (done[-1], done[-1] + 1)    # the last completed save, or one whose rename landed
        assert (tensors["w"] == meta["i"]).all()
        last = meta["i"]
        stale_seen += any(p.endswith(".tmp") for p in os.listdir(tmp_path))
        save_checkpoint(path, tensors, meta)            # the next save (a resumed run's)
        assert sorted(os.listdir(tmp_path)) == ["ckpt.safetensors", "writer.py"]
    assert stale_seen >= 1, "no kill landed during a write: the test did not test it"


def test_errors_named_here_are_minidnn_errors():
    assert issubclass(T.TraceError, MinidnnError) and issubclass(CheckpointError, MinidnnError)
    assert issubclass(DataError, MinidnnError)
