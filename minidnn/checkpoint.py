"""Atomic safetensors checkpoints, PyTorch state_dict import and RNG state round trips.

A checkpoint is one safetensors file; the caller's JSON-serialisable ``meta``
dict lives in the safetensors header metadata under the key ``"minidnn"``, and
a SHA-256 digest of that metadata and of every tensor (dtype, shape and bytes)
under ``"minidnn.sha256"``: a flipped byte, a removed tensor or a removed field
is found on load, naming the tensor. Every failure to read raises
:class:`~minidnn.errors.CheckpointError` with a one-line message naming the file.

Writes go to a temporary sibling renamed into place, so a write killed at any
point leaves the previous checkpoint; the temporary files such a kill leaves
behind are removed by the next save. A temporary file's name carries its
writer's host and process id, and only those of processes that ended on this
host are removed: another run writing the same path keeps its own.
"""

import glob
import hashlib
import json
import os
import re
import socket
import struct
import tempfile
import zipfile

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save

from .backend import to_numpy
from .errors import CheckpointError

_META_KEY = "minidnn"
_SUM_KEY = "minidnn.sha256"
_META_DIGEST = "__metadata__"      # the digest of the meta JSON, beside the tensors' (no tensor has this name)

# safetensors dtype names numpy understands natively; BF16 is widened by hand.
_SAFETENSORS_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
    "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
    "F16": np.float16, "F32": np.float32, "F64": np.float64,
}


def _error(path, what, exc=None):
    message = f"{path}: {what}" + (f" ({type(exc).__name__}: {exc})" if exc is not None else "")
    return CheckpointError(" ".join(message.split()))  # one line, whatever the cause said


def _digest(array):
    """SHA-256 of a tensor's dtype, shape and bytes: a change to any of them changes it."""
    h = hashlib.sha256(f"{array.dtype.str}{list(array.shape)}".encode())
    h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return h.hexdigest()


def _text_digest(text):
    return hashlib.sha256(text.encode()).hexdigest()


def save_checkpoint(path, tensors, meta):
    """Write ``tensors`` (name -> ndarray) and ``meta`` (a JSON-serialisable dict) to ``path``.

    The file is written to a temporary sibling, fsynced and moved into place with
    ``os.replace``, so a crash at any point leaves the previous checkpoint intact.
    """
    path = os.fspath(path)
    if not isinstance(meta, dict):
        raise _error(path, f"meta must be a dict, got {type(meta).__name__}")
    try:
        meta_json = json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise _error(path, "meta is not JSON-serialisable", exc) from exc
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise _error(path, f"tensor name {name!r} is not a string")
        # safetensors rejects strided views; ascontiguousarray would turn 0-d into 1-d.
        arrays[name] = np.require(to_numpy(value), requirements="C")   # device arrays: host copies
    if _META_DIGEST in arrays:
        raise _error(path, f"tensor name {_META_DIGEST!r} is reserved")
    digests = {name: _digest(a) for name, a in arrays.items()}
    digests[_META_DIGEST] = _text_digest(meta_json)
    try:
        payload = save(arrays, metadata={_META_KEY: meta_json, _SUM_KEY: json.dumps(digests)})
    except (SafetensorError, TypeError, ValueError) as exc:
        raise _error(path, "cannot serialise tensors", exc) from exc
    _write_atomic(path, payload)


def _writer_ended(name, prefix):
    """Whether the writer of temporary file ``name`` (``<prefix><pid>@<host>.<random>.tmp``) has ended:
    a process of this host that no longer runs. Names without a writer (older minidnn) count as ended;
    a process of another host (a shared folder) is never taken for ended."""
    m = re.fullmatch(re.escape(prefix) + r"(\d+)@(.+)\.[^.]+\.tmp", name)
    if m is None:
        return True
    if m.group(2) != socket.gethostname():
        return False
    try:
        os.kill(int(m.group(1)), 0)        # signal 0: only whether the process exists
    except (ProcessLookupError, OverflowError):   # no such process (a pid out of range is none either)
        return True
    except PermissionError:                # another user's process: alive
        pass
    return False


def _write_atomic(path, payload):
    directory = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}."
    for stale in glob.glob(os.path.join(glob.escape(directory), glob.escape(prefix) + "*.tmp")):
        if not _writer_ended(os.path.basename(stale), prefix):
            continue                       # a live writer's, in the middle of its write
        try:                               # left by a write that was killed: never renamed into place
            os.unlink(stale)
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{prefix}{os.getpid()}@{socket.gethostname()}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600; keep the old file's mode, else the usual 0644.
        os.chmod(tmp, os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory):
    # Makes the rename itself durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path):
    """Read a checkpoint written by :func:`save_checkpoint`; returns ``(tensors, meta)``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise _error(path, "checkpoint file not found")
    try:
        with safe_open(path, framework="numpy") as fh:
            header = fh.metadata() or {}
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except (SafetensorError, OSError, TypeError, ValueError) as exc:
        raise _error(path, "not a valid safetensors checkpoint (truncated or corrupt)", exc) from exc
    if _META_KEY not in header:
        raise _error(path, f"safetensors file has no '{_META_KEY}' metadata; not a minidnn checkpoint")
    _verify(path, header, tensors)
    try:
        meta = json.loads(header[_META_KEY])
    except ValueError as exc:
        raise _error(path, "minidnn metadata is not valid JSON", exc) from exc
    if not isinstance(meta, dict):
        raise _error(path, f"minidnn metadata is a {type(meta).__name__}, not a dict")
    return tensors, meta


def _verify(path, header, tensors):
    """Compare the file's content with the digests it was written with; CheckpointError naming what differs."""
    if _SUM_KEY not in header:
        raise _error(path, f"no '{_SUM_KEY}' checksums in its metadata (removed, or written by an older "
                           "minidnn): its content cannot be verified")
    try:
        digests = json.loads(header[_SUM_KEY])
        if not (isinstance(digests, dict) and all(isinstance(v, str) for v in digests.values())):
            raise ValueError("not a table of digests")
    except ValueError as exc:
        raise _error(path, "the checksum table is corrupt", exc) from exc
    if digests.get(_META_DIGEST) != _text_digest(header[_META_KEY]):
        raise _error(path, "the minidnn metadata does not match its checksum (corrupt)")
    expected = set(digests) - {_META_DIGEST}
    missing, unknown = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing:
        raise _error(path, f"tensor {missing[0]!r} is missing" + (f" (and {len(missing) - 1} more)" if
                                                                 len(missing) > 1 else ""))
    if unknown:
        raise _error(path, f"tensor {unknown[0]!r} has no checksum (added after the file was written)")
    for name in sorted(expected):
        if _digest(tensors[name]) != digests[name]:
            raise _error(path, f"tensor {name!r} does not match its checksum (corrupt data)")


def load_state_dict_file(path):
    """Import a PyTorch-style state_dict saved as ``.safetensors`` or ``.npz`` as NumPy arrays.

    Keys are kept as written (e.g. ``layer1.0.conv1.weight``).  bfloat16 tensors,
    which NumPy lacks, are widened exactly to float32.
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".safetensors", ".npz"):
        raise _error(path, f"unknown state_dict extension {ext!r}; export with "
                           "safetensors (.safetensors) or numpy.savez (.npz)")
    if not os.path.isfile(path):
        raise _error(path, "state_dict file not found")
    if ext == ".npz":
        try:
            # Own the handle: np.load(path) leaks it when the zip is corrupt.
            with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise _error(path, "not a valid .npz state_dict", exc) from exc
    try:   # bfloat16 (a NumPy dtype where ml_dtypes is installed) is widened to float32, exactly
        return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in load_file(path).items()}
    except TypeError:
        pass  # numpy cannot name BF16; decode the file ourselves below
    except (SafetensorError, OSError, ValueError) as exc:
        raise _error(path, "not a valid safetensors state_dict", exc) from exc
    try:
        return _load_safetensors_manually(path)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise _error(path, "not a valid safetensors state_dict", exc) from exc


def _load_safetensors_manually(path):
    with open(path, "rb") as fh:
        raw = fh.read()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    data = memoryview(raw)[8 + header_len:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        chunk = data[begin:end]
        if info["dtype"] == "BF16":
            # bfloat16 is the top half of a float32, so shifting is exact.
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif info["dtype"] in _SAFETENSORS_DTYPES:
            array = np.frombuffer(chunk, dtype=np.dtype(_SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<"))
        else:
            raise ValueError(f"tensor {name!r} has unsupported dtype {info['dtype']}")
        out[name] = array.reshape(info["shape"]).copy()
    return out


def rng_state(gen):
    """JSON-serialisable snapshot of a ``numpy.random.Generator``'s bit generator state."""
    return _to_json(gen.bit_generator.state)


def _to_json(value):
    if isinstance(value, dict):
        return {key: _to_json(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):  # MT19937 keeps its key as an array
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_json(value):
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        return {key: _from_json(item) for key, item in value.items()}
    return value


def restore_rng(state):
    """Rebuild a ``numpy.random.Generator`` from :func:`rng_state`'s output."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    bit_generator_type = getattr(np.random, str(name), None)
    if not (isinstance(bit_generator_type, type) and issubclass(bit_generator_type, np.random.BitGenerator)):
        raise CheckpointError(f"RNG state names unknown bit generator {name!r}")
    bit_generator = bit_generator_type()
    try:
        bit_generator.state = _from_json(state)
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise CheckpointError(f"invalid {name} RNG state: {exc}") from exc
    return np.random.Generator(bit_generator)
