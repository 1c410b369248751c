"""In-memory image data sets (digits, MNIST, CIFAR, ImageFolder, synthetic) and a prefetching loader.

Every loader returns a :class:`Dataset` holding float32 NCHW images in [0, 1]
(synthetic data is standard normal) and int64 labels.  Malformed input raises
:class:`~minidnn.errors.DataError` with a one-line message naming the file.
"""

import gzip
import os
import pickle
import queue
import threading
import zlib
from typing import NamedTuple

import numpy as np

from .distributed.parallel import shard_range
from .errors import ConfigError, DataError
from .memory.config import format_bytes

_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
_SCHEMES = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "imagefolder", "synthetic")


class Dataset:
    """Images (N, C, H, W) float32 and labels (N,) int64 held in memory."""

    def __init__(self, images, labels, num_classes, name):
        images = np.ascontiguousarray(images, dtype=np.float32)
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        if images.ndim != 4 or labels.shape != (images.shape[0],):
            raise DataError(f"{name}: images {images.shape} and labels {labels.shape} do not match")
        self.images, self.labels = images, labels
        self.num_classes, self.name = int(num_classes), name

    def __len__(self):
        return self.images.shape[0]

    @property
    def shape(self):
        """Shape (C, H, W) of one image."""
        return tuple(self.images.shape[1:])

    def __repr__(self):
        return f"Dataset({self.name!r}, n={len(self)}, shape={self.shape}, classes={self.num_classes})"


def resize_bilinear(images, size):
    """Resize NCHW images to ``size`` x ``size`` by bilinear interpolation.

    Uses half-pixel centres (like ``align_corners=False`` in other frameworks), so
    an upscale by an integer factor keeps the image centred and a constant image
    stays constant.
    """
    n, c, h, w = images.shape
    if (h, w) == (size, size):
        return images.astype(np.float32, copy=True)
    _check_fits(n, (c, size, size))

    def axis(src, dst):
        pos = np.clip((np.arange(dst) + 0.5) * src / dst - 0.5, 0, src - 1)
        lo = np.floor(pos).astype(np.intp)
        hi = np.minimum(lo + 1, src - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    y0, y1, wy = axis(h, size)
    x0, x1, wx = axis(w, size)
    try:
        rows = images[:, :, y0, :] * (1 - wy)[:, None] + images[:, :, y1, :] * wy[:, None]
        out = rows[:, :, :, x0] * (1 - wx) + rows[:, :, :, x1] * wx
        return np.ascontiguousarray(out, dtype=np.float32)
    except MemoryError:              # within the machine's memory, but not within what is free
        raise DataError(f"resizing {n} images to {size}x{size} ran out of memory: choose a smaller image "
                        "size") from None


def _check_fits(n, shape):
    """DataError where ``n`` float32 images of ``shape`` (C, H, W) exceed this machine's memory (else a
    MemoryError traceback, or the machine swapping until the kernel ends the process)."""
    need = n * int(np.prod(shape, dtype=object)) * 4
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise DataError(f"{n} images of {'x'.join(map(str, shape))} would take {format_bytes(need)}, more than "
                        f"this machine's {format_bytes(have)} of memory: choose a smaller image size (or fewer images)")


def _check_split(split, allowed=("train", "test")):
    if split not in allowed:
        raise DataError(f"unknown split {split!r}; expected one of {', '.join(allowed)}")


def load_digits(size=28, split="train", test_fraction=0.2, seed=0):
    """The bundled 8x8 handwritten digits, scaled to [0, 1] and resized bilinearly to ``size``.

    ``minidnn/digits.npz``: the 1797 images of the UCI optical recognition of handwritten
    digits test set (Alpaydin and Kaynak, 1998; pixel counts 0-16 of 4x4 blocks), as
    scikit-learn ships them, with their labels.

    The held-out split is stratified: each class is shuffled by ``seed`` and its
    first ``round(test_fraction * count)`` samples form the test split, so the two
    splits are disjoint, deterministic and keep the class balance.
    """
    _check_split(split)
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    with np.load(os.path.join(os.path.dirname(__file__), "digits.npz")) as bundled:
        images = (bundled["images"].astype(np.float32) / 16.0)[:, None, :, :]
        labels = bundled["labels"].astype(np.int64)
    rng = np.random.default_rng(seed)
    test_mask = np.zeros(len(labels), dtype=bool)
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        test_mask[members[: int(round(test_fraction * len(members)))]] = True
    keep = np.flatnonzero(test_mask if split == "test" else ~test_mask)
    return Dataset(resize_bilinear(images[keep], size), labels[keep], 10, "digits")


# ---------------------------------------------------------------- MNIST (IDX)

def _find_file(root, name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(root, candidate)
        if os.path.isfile(path):
            return path
    raise DataError(f"missing file {os.path.join(root, name)} (or {name}.gz)")


def _read_bytes(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                return fh.read()
        with open(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError; a damaged stream, zlib.error
        raise DataError(f"{path}: cannot read ({exc})".replace("\n", " ")) from exc


def read_idx(path, expected_ndim):
    """Parse an IDX file of unsigned bytes, validating magic, dims and length."""
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(f"{path}: file too short for an IDX header ({len(raw)} bytes)")
    zero, dtype_code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or dtype_code != 0x08 or ndim != expected_ndim:
        raise DataError(f"{path}: bad IDX magic 0x{raw[:4].hex()}, expected 0x000008{expected_ndim:02x}")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} of {header_len} bytes)")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims)) + header_len
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "trailing bytes"
        raise DataError(f"{path}: {what}: header promises dims {dims} = {expected} bytes, file has {len(raw)}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(dims)


def load_mnist(root, split="train", name="mnist"):
    """MNIST or Fashion-MNIST from IDX files in ``root`` (each optionally ``.gz``)."""
    _check_split(split)
    prefix = "train" if split == "train" else "t10k"
    image_path = _find_file(root, f"{prefix}-images-idx3-ubyte")
    label_path = _find_file(root, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_idx(image_path, 3), read_idx(label_path, 1)
    if images.shape[0] == 0:         # else 0 steps of training, and an accuracy measured on nothing learned
        raise DataError(f"{image_path}: no images (its IDX header gives 0); the {split} split needs at least one")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{label_path}: {labels.shape[0]} labels but {image_path} has {images.shape[0]} images")
    if labels.size and labels.max() > 9:
        raise DataError(f"{label_path}: label {labels.max()} out of range 0..9")
    return Dataset(images[:, None].astype(np.float32) / 255.0, labels, 10, name)


# ---------------------------------------------------------------- CIFAR

class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles CIFAR batches without letting the file run arbitrary code."""

    _MODULES = {"numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric"}
    _NAMES = {"_reconstruct", "ndarray", "dtype", "scalar", "_frombuffer"}

    def find_class(self, module, name):
        if (module, name) == ("_codecs", "encode") or (module in self._MODULES and name in self._NAMES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _cifar_files(which, split, fmt):
    if which == 10:
        names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    else:
        names = [split]
    return [n + ".bin" for n in names] if fmt == "bin" else names


def _read_cifar_bin(path, which):
    raw = _read_bytes(path)
    label_bytes = 1 if which == 10 else 2
    record = label_bytes + 3072
    if len(raw) == 0 or len(raw) % record:
        raise DataError(f"{path}: {len(raw)} bytes is not a whole number of {record}-byte CIFAR-{which} records")
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, record)
    return rows[:, label_bytes:], rows[:, label_bytes - 1]  # CIFAR-100: fine label is the 2nd byte


def _read_cifar_pickle(path, which):
    try:
        with open(path, "rb") as fh:
            batch = _NumpyOnlyUnpickler(fh, encoding="bytes").load()
    except Exception as exc:  # a corrupt pickle can raise almost any type
        raise DataError(f"{path}: not a CIFAR python batch ({type(exc).__name__}: {exc})".replace("\n", " ")) from exc
    if not isinstance(batch, dict):
        raise DataError(f"{path}: not a CIFAR python batch (got {type(batch).__name__})")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    label_key = "labels" if which == 10 else "fine_labels"
    if "data" not in batch or label_key not in batch:
        raise DataError(f"{path}: CIFAR-{which} batch lacks 'data' or '{label_key}'")
    data, labels = np.asarray(batch["data"]), np.asarray(batch[label_key])
    if data.ndim != 2 or data.shape[1] != 3072 or data.shape[0] != labels.shape[0]:
        raise DataError(f"{path}: data {data.shape} and labels {labels.shape} do not form CIFAR records")
    return data, labels


def load_cifar(root, split="train", which=10):
    """CIFAR-10/100 from the binary or python distribution, autodetected in ``root``.

    ``root`` may be the batch folder itself or its parent holding the usual
    ``cifar-10-batches-bin``/``-py`` or ``cifar-100-binary``/``-python`` folder.
    CIFAR-100 uses the fine (100-class) labels.
    """
    _check_split(split)
    if which not in (10, 100):
        raise DataError(f"CIFAR variant must be 10 or 100, got {which}")
    subdirs = (["cifar-10-batches-bin", "cifar-10-batches-py"] if which == 10
               else ["cifar-100-binary", "cifar-100-python"])
    for folder in [root] + [os.path.join(root, s) for s in subdirs]:
        for fmt, reader in (("bin", _read_cifar_bin), ("py", _read_cifar_pickle)):
            names = _cifar_files(which, split, fmt)
            if not os.path.isfile(os.path.join(folder, names[0])):
                continue
            parts = []
            for name in names:
                path = os.path.join(folder, name)
                if not os.path.isfile(path):
                    raise DataError(f"missing file {path}")
                parts.append(reader(path, which))
            images = np.concatenate([p[0] for p in parts]).reshape(-1, 3, 32, 32)
            labels = np.concatenate([p[1] for p in parts]).astype(np.int64)
            if labels.size and (labels.min() < 0 or labels.max() >= which):
                raise DataError(f"{folder}: CIFAR-{which} label out of range 0..{which - 1}")
            return Dataset(images.astype(np.float32) / 255.0, labels, which, f"cifar{which}")
    wanted = " or ".join(_cifar_files(which, split, "bin")[:1] + _cifar_files(which, split, "py")[:1])
    raise DataError(f"missing CIFAR-{which} {split} data: no {wanted} in {root} or its {'/'.join(subdirs)} subfolders")


# ---------------------------------------------------------------- ImageFolder

def _pillow():
    """PIL.Image, or a one-line DataError saying what to install."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise DataError(f"imagefolder: reading images needs Pillow, a dependency of minidnn that is missing "
                        f"({exc}): pip install pillow".replace("\n", " ")) from None
    return Image


def _class_folders(root):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def load_image_folder(root, size, split=None):
    """ImageFolder tree ``root/<class>/*.png|jpg|jpeg``; labels follow sorted class names.

    If ``root`` has a ``train/`` subfolder it is a split tree and ``split`` picks
    ``train``, or ``test``/``val`` (whichever folder exists); ``split=None`` means
    ``train``.  Without split subfolders the whole tree is returned for any split.
    In a split tree the labels of every split are those of ``train/``'s classes: a
    test folder may lack a class (the others keep their labels), but not have one
    that ``train/`` lacks.
    """
    Image = _pillow()
    classes = train = None
    if os.path.isdir(os.path.join(root, "train")):
        split = split or "train"
        options = ["train"] if split == "train" else ["test", "val"] if split in ("test", "val") else []
        folders = [os.path.join(root, s) for s in options if os.path.isdir(os.path.join(root, s))]
        if not folders:
            raise DataError(f"{root}: no folder for split {split!r} (expected train/, test/ or val/)")
        # numbered by position in the split's own folder, a class missing from test/ would shift the others
        classes = _class_folders(os.path.join(root, "train"))
        train, root = os.path.join(root, "train"), folders[0]
    if not os.path.isdir(root):
        raise DataError(f"missing image folder {root}")
    present = _class_folders(root)
    classes = present if classes is None else classes
    for cls in present:
        if cls not in classes:
            raise DataError(f"{os.path.join(root, cls)}: class {cls!r} has no folder in {train}, so it has no "
                            f"label (the training classes: {', '.join(classes)})")
    files = []
    for cls in present:
        names = [f for f in sorted(os.listdir(os.path.join(root, cls))) if f.lower().endswith(_IMAGE_EXTENSIONS)]
        if not names:
            # A class without images would still be a label: the network would learn one class too many.
            raise DataError(f"{os.path.join(root, cls)}: class folder has no .png/.jpg/.jpeg images")
        files += [(os.path.join(root, cls, f), classes.index(cls)) for f in names]
    if not files:
        raise DataError(f"{root}: no .png/.jpg/.jpeg images in class subfolders")
    _check_fits(len(files), (3, size, size))
    images = []
    for path, _ in files:
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((size, size), Image.BILINEAR)
        except (OSError, ValueError, SyntaxError) as exc:  # PIL raises all three on bad files
            raise DataError(f"{path}: unreadable image ({exc})".replace("\n", " ")) from exc
        images.append(np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1))
    return Dataset(np.stack(images).astype(np.float32) / 255.0, [label for _, label in files], len(classes),
                   "imagefolder")


def synthetic(shape=(3, 32, 32), num_classes=10, n=512, seed=0):
    """Standard-normal images with uniform random labels, deterministic by ``seed``."""
    if len(shape) != 3 or min(shape) < 1 or num_classes < 1 or n < 1:
        raise DataError(f"synthetic data needs a CxHxW shape of positive sizes, at least one class and one "
                        f"image; got shape {'x'.join(map(str, shape))}, {num_classes} classes, n={n}")
    _check_fits(n, shape)
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n, *shape), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=n)
    return Dataset(images, labels, num_classes, "synthetic")


def _parse_synthetic(arg, split):
    parts = arg.split(":") if arg else []
    try:
        shape = tuple(int(d) for d in parts[0].split("x")) if parts and parts[0] else (3, 32, 32)
        options = dict(p.split("=", 1) for p in parts[1:])
        num_classes, n = int(options.pop("classes", 10)), int(options.pop("n", 512))
    except ValueError as exc:
        raise DataError(f"bad synthetic spec {arg!r}: expected CxHxW[:classes=K][:n=N]") from exc
    if len(shape) != 3 or options:
        raise DataError(f"bad synthetic spec {arg!r}: expected CxHxW[:classes=K][:n=N]")
    # A different seed for the test split so it is not a copy of the training data.
    return synthetic(shape, num_classes, n, seed=0 if split == "train" else 1)


def load(spec="digits", split="train", size=None):
    """Load a data set from a spec string such as ``digits``, ``mnist:/data/mnist`` or
    ``synthetic:3x32x32:classes=10:n=512``.

    ``size`` resizes images to ``size`` x ``size`` (bilinear); digits default to 28
    and ImageFolder to 32, other sets keep their native size when ``size`` is None.
    """
    if spec is not None and not isinstance(spec, str):
        raise DataError(f"a data set spec is a string such as 'digits' or 'cifar10:DIR', got {spec!r}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1):
        raise DataError(f"image size must be a positive number of pixels, got {size!r}")
    scheme, _, arg = (spec or "digits").partition(":")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise DataError(f"unknown data set {scheme!r} in spec {spec!r}; valid: {', '.join(_SCHEMES)}")
    if scheme == "digits":
        return load_digits(size=size or 28, split=split)
    if scheme == "synthetic":
        dataset = _parse_synthetic(arg, split)
    elif not arg:
        raise DataError(f"data set spec {spec!r} needs a path: {scheme}:/path/to/data")
    elif scheme == "imagefolder":
        return load_image_folder(arg, size or 32, split)
    elif scheme in ("mnist", "fashion-mnist"):
        dataset = load_mnist(arg, split, name=scheme)
    else:
        dataset = load_cifar(arg, split, which=int(scheme[len("cifar"):]))
    if size is not None and dataset.shape[1:] != (size, size):
        dataset.images = resize_bilinear(dataset.images, size)
    return dataset


def fingerprint(dataset) -> str:
    """A short text that differs where two data sets differ: their size, image shape, classes and a CRC-32
    of every image and label (data-parallel ranks compare theirs before training; about 1 s per GB, less
    than the normalization statistics computed from the same images)."""
    crc = zlib.crc32(np.ascontiguousarray(dataset.labels).data)
    crc = zlib.crc32(np.ascontiguousarray(dataset.images).data, crc)
    return (f"{len(dataset)} images of {'x'.join(map(str, dataset.shape))}, {dataset.num_classes} classes, "
            f"crc32 {crc:08x}")


# ---------------------------------------------------------------- normalization

class Normalization(NamedTuple):
    """Per-channel input normalization ``(x - mean) / std`` over axis 1, kept with a trainer.

    A trainer compiled with ``normalize=(mean, std)`` applies it in ``step`` and
    ``predict``, and its checkpoints store it, so a network loaded from one is
    fed as it was trained. One value broadcasts over every channel.
    """

    mean: tuple
    std: tuple

    @classmethod
    def of(cls, value, channels=None, where="normalize"):
        """``value`` - (mean, std), a dict with "mean" and "std", a Normalization, or None - checked.

        ConfigError naming ``where`` for a std that is not positive, a value that is
        not finite, or a count that is neither 1 nor ``channels``."""
        if value is None:
            return None
        try:
            mean, std = (value["mean"], value["std"]) if isinstance(value, dict) else value
            mean = np.asarray(mean, dtype=np.float64).reshape(-1)
            std = np.asarray(std, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError, KeyError):
            raise ConfigError(f"{where}: expected (mean, std), per-channel numbers, got {value!r:.80}") from None
        if mean.size == 0 or std.size == 0 or not (np.isfinite(mean).all() and np.isfinite(std).all()):
            raise ConfigError(f"{where}: mean and std must be finite numbers, got {mean.tolist()}, {std.tolist()}")
        if (std <= 0).any():
            raise ConfigError(f"{where}: std must be positive, got {std.tolist()}")
        counts = {mean.size, std.size} - {1}
        if len(counts) > 1 or (channels is not None and counts - {channels}):
            need = ("one value" if channels == 1 else f"1 or {channels} values" if channels
                    else "1 value or one per channel")
            raise ConfigError(f"{where}: mean and std need {need}, got {mean.size} and {std.size}")
        return cls(tuple(mean.tolist()), tuple(std.tolist()))

    def apply(self, x):
        """``(x - mean) / std`` per channel: in float32 for float32 (and byte) images, as
        ``DataLoader(mean=, std=)`` computes it."""
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean = np.asarray(self.mean, dtype=np.float32).reshape(shape)
        std = np.asarray(self.std, dtype=np.float32).reshape(shape)
        return np.ascontiguousarray((x - mean) / std)

    def to_dict(self):
        """The JSON form checkpoints store: {"mean": [...], "std": [...]}."""
        return {"mean": list(self.mean), "std": list(self.std)}


# ---------------------------------------------------------------- DataLoader

_END = object()


class DataLoader:
    """Iterates (x, y) batches: x float32 C-contiguous NCHW, y int64.

    Shuffling and augmentation draw from ``np.random.default_rng([seed, epoch])``,
    so an epoch is reproducible from (seed, epoch) alone.  The epoch advances by
    one after each fully consumed pass; ``set_epoch`` overrides it.  Batches are
    built by a background thread, ``prefetch`` batches ahead (0 = no thread).
    With ``shard=(rank, ranks)`` each batch is this rank's slice of the global batch
    (:func:`~minidnn.distributed.shard_range`), every rank the same number of them: a
    last batch with fewer samples than ranks leaves some ranks an empty slice.
    """

    def __init__(self, dataset, batch_size, shuffle=True, drop_last=False, seed=0,
                 mean=None, std=None, augment=False, prefetch=2, pad=4, shard=None):
        if batch_size < 1 or prefetch < 0:
            raise DataError(f"batch_size must be >= 1 and prefetch >= 0, got {batch_size}, {prefetch}")
        # data-parallel (rank, ranks): each batch is this rank's slice of the global batch_size
        self.shard = tuple(shard) if shard is not None else (0, 1)
        if batch_size < self.shard[1]:
            raise DataError(f"a batch of {batch_size} cannot be shared by {self.shard[1]} ranks")
        self.dataset, self.batch_size = dataset, int(batch_size)
        if augment not in (False, True, "crop", "crop+flip"):
            raise DataError(f"augment must be False, 'crop' or 'crop+flip' (True), got {augment!r}")
        self.shuffle, self.drop_last = shuffle, drop_last
        self.augment = "crop+flip" if augment is True else augment
        if pad < 0:
            raise DataError(f"pad (zero padding before the random crop) must be >= 0, got {pad}")
        self.pad = int(pad)
        self.seed, self.epoch, self.prefetch = int(seed), 0, int(prefetch)
        self._mean = self._std = None
        if mean is not None or std is not None:
            mean = np.asarray(mean if mean is not None else 0.0, dtype=np.float32).reshape(-1)
            std = np.asarray(std if std is not None else 1.0, dtype=np.float32).reshape(-1)
            if np.any(std <= 0):
                raise DataError(f"normalization std must be positive, got {std.tolist()}")
            channels = getattr(dataset, "shape", (None,))[0]
            if channels is not None and {mean.size, std.size} - {1, channels}:
                raise DataError(f"mean/std need 1 or {channels} values, got {mean.size} and {std.size}")
            self._mean, self._std = mean[None, :, None, None], std[None, :, None, None]

    def __len__(self):
        # a last partial batch is one more step on every rank, also with fewer samples than ranks: a rank
        # without a sample of it gets an empty slice, and its trainer adds nothing to that step
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (not self.drop_last and rest > 0)

    @property
    def normalization(self):
        """The :class:`Normalization` this loader applies to its batches, or None (a trainer
        compiled with ``normalize=`` applies it instead, and keeps it in its checkpoints)."""
        if self._mean is None:
            return None
        return Normalization(tuple(self._mean.reshape(-1).tolist()), tuple(self._std.reshape(-1).tolist()))

    def set_epoch(self, epoch):
        """Select the epoch whose shuffle and augmentation the next pass uses."""
        self.epoch = int(epoch)

    def state_dict(self):
        """The (epoch, seed) needed to resume at the start of the current epoch."""
        return {"epoch": self.epoch, "seed": self.seed}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned."""
        self.epoch, self.seed = int(state["epoch"]), int(state["seed"])

    def _augment(self, x, rng, b, rows):
        # The standard CIFAR recipe on raw pixels: zero-pad, random crop back, random flip
        # (no flip with "crop": it would turn digits into other symbols). The draws are the
        # whole batch's (b images); x holds its ``rows``.
        _, _, h, w = x.shape
        p = self.pad
        padded = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        offsets = rng.integers(0, 2 * p + 1, size=(b, 2))[rows]
        flips = (rng.random(b) < 0.5)[rows]
        if self.augment == "crop":
            flips[:] = False
        out = np.empty_like(x)
        for i, (dy, dx) in enumerate(offsets):
            crop = padded[i, :, dy:dy + h, dx:dx + w]
            out[i] = crop[:, :, ::-1] if flips[i] else crop
        return out

    def _batches(self, epoch):
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.dataset)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        for b in range(len(self)):
            batch = order[b * self.batch_size:(b + 1) * self.batch_size]
            rows = slice(*shard_range(len(batch), *self.shard))
            idx = batch[rows]
            x = np.asarray(self.dataset.images[idx], dtype=np.float32)
            if self.augment:
                x = self._augment(x, rng, len(batch), rows)
            if self._mean is not None:
                x = (x - self._mean) / self._std
            yield np.ascontiguousarray(x, dtype=np.float32), np.asarray(self.dataset.labels[idx], dtype=np.int64)

    def __iter__(self):
        epoch = self.epoch
        if self.prefetch == 0:
            yield from self._batches(epoch)
        else:
            yield from self._threaded(epoch)
        self.epoch = epoch + 1  # only reached when the pass was fully consumed

    def _threaded(self, epoch):
        batches = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item):
            # Poll so an abandoned consumer (break / close) cannot block us forever.
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def work():
            try:
                for batch in self._batches(epoch):
                    if not put(batch):
                        return
                put(_END)
            except BaseException as exc:  # re-raised in the consumer
                put(exc)

        worker = threading.Thread(target=work, name="minidnn-DataLoader", daemon=True)
        worker.start()
        try:
            while True:
                item = batches.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            worker.join()
