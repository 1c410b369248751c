"""Data set loaders against fixture files written here, and the prefetching DataLoader."""

import gzip
import os
import pickle
import struct
import sys
import threading

import numpy as np
import pytest
from PIL import Image

from minidnn.data import (DataLoader, Dataset, load, load_cifar, load_digits, load_image_folder,
                          load_mnist, resize_bilinear, synthetic)
from minidnn.errors import DataError


def assert_names(excinfo, path):
    message = str(excinfo.value)
    assert str(path) in message and "\n" not in message


# ---------------------------------------------------------------- digits / synthetic / spec

def test_digits_shapes_range_and_split():
    train, test = load_digits(split="train"), load_digits(split="test")
    assert train.shape == (1, 28, 28) and train.images.dtype == np.float32
    assert train.labels.dtype == np.int64 and train.num_classes == 10
    assert len(train) + len(test) == 1797
    assert 0.0 <= train.images.min() and train.images.max() <= 1.0
    # stratified: every class keeps roughly the 80/20 balance
    assert np.all(np.abs(np.bincount(test.labels) / np.bincount(train.labels) - 0.25) < 0.05)
    again = load_digits(split="test")
    np.testing.assert_array_equal(again.images, test.images)
    other = load_digits(split="test", seed=1)
    assert not np.array_equal(other.labels, test.labels)


def test_digits_native_size_is_the_bundled_data_unscaled():
    """The bundled digits are the optdigits test set: 1797 images of 4x4-block counts 0-16, every class
    present (174-183 each), split into disjoint train and test sets; scikit-learn's copy, where installed,
    is the same data."""
    parts = [load_digits(size=8, split=s) for s in ("train", "test")]
    full = np.concatenate([p.images for p in parts])
    labels = np.concatenate([p.labels for p in parts])
    assert full.shape == (1797, 1, 8, 8)
    counts = full * 16.0
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-5)
    assert counts.min() == 0 and round(counts.max()) == 16
    assert sorted(np.bincount(labels, minlength=10)) == sorted([178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
    try:
        from sklearn.datasets import load_digits as sk
    except ImportError:
        return
    np.testing.assert_allclose(np.sort(full.reshape(-1)), np.sort(sk().images.reshape(-1) / 16.0), atol=1e-6)


def test_resize_bilinear_keeps_constants_and_integer_upscale():
    const = np.full((2, 3, 8, 8), 0.7, np.float32)
    np.testing.assert_allclose(resize_bilinear(const, 28), 0.7, atol=1e-6)
    img = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    up = resize_bilinear(img, 4)
    np.testing.assert_allclose(up[0, 0, 0], [0, 0.25, 0.75, 1])  # half-pixel centres
    assert up.flags.c_contiguous


def test_synthetic_deterministic():
    a, b = synthetic((1, 4, 4), 3, 20, seed=5), synthetic((1, 4, 4), 3, 20, seed=5)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.shape == (1, 4, 4) and a.labels.max() < 3 and len(a) == 20


def test_load_spec_parsing():
    d = load("synthetic:1x8x8:classes=3:n=20", "train")
    assert d.shape == (1, 8, 8) and len(d) == 20 and d.num_classes == 3
    assert not np.array_equal(d.images, load("synthetic:1x8x8:classes=3:n=20", "test").images)
    assert load("synthetic", "train").shape == (3, 32, 32)
    assert load("digits", "test", size=16).shape == (1, 16, 16)
    assert load(None, "test").shape == (1, 28, 28)
    with pytest.raises(DataError, match="valid: digits, mnist, fashion-mnist, cifar10"):
        load("svhn:/x", "train")
    with pytest.raises(DataError, match="needs a path"):
        load("mnist", "train")
    with pytest.raises(DataError, match="synthetic"):
        load("synthetic:3x32", "train")


def test_dataset_rejects_mismatch():
    with pytest.raises(DataError):
        Dataset(np.zeros((3, 1, 2, 2)), np.zeros(2), 2, "x")


# ---------------------------------------------------------------- MNIST IDX

def idx_bytes(array, magic_ndim=None):
    ndim = array.ndim if magic_ndim is None else magic_ndim
    return bytes([0, 0, 8, ndim]) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()


def write_mnist(root, split="train", n=5, gz=False):
    prefix = "train" if split == "train" else "t10k"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    opener = gzip.open if gz else open
    suffix = ".gz" if gz else ""
    paths = root / f"{prefix}-images-idx3-ubyte{suffix}", root / f"{prefix}-labels-idx1-ubyte{suffix}"
    for path, array in zip(paths, (images, labels)):
        with opener(path, "wb") as fh:
            fh.write(idx_bytes(array))
    return images, labels, paths


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("split", ["train", "test"])
def test_mnist_round_trip(tmp_path, gz, split):
    images, labels, _ = write_mnist(tmp_path, split, gz=gz)
    ds = load_mnist(tmp_path, split)
    assert ds.shape == (1, 28, 28) and ds.images.dtype == np.float32
    np.testing.assert_allclose(ds.images[:, 0], images / 255.0, atol=1e-7)
    np.testing.assert_array_equal(ds.labels, labels)
    assert load(f"fashion-mnist:{tmp_path}", split).name == "fashion-mnist"
    assert load(f"mnist:{tmp_path}", split, size=14).shape == (1, 14, 14)


def test_mnist_missing_file(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="missing") as excinfo:
        load_mnist(tmp_path, "train")
    assert_names(excinfo, tmp_path / "train-labels-idx1-ubyte")


def test_mnist_wrong_magic(tmp_path):
    _, _, (image_path, _) = write_mnist(tmp_path)
    raw = bytearray(image_path.read_bytes())
    raw[3] = 1
    image_path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="magic") as excinfo:
        load_mnist(tmp_path, "train")
    assert_names(excinfo, image_path)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_truncated(tmp_path, gz):
    _, _, (image_path, _) = write_mnist(tmp_path, gz=gz)
    raw = image_path.read_bytes()
    image_path.write_bytes(raw[: len(raw) - 10])
    with pytest.raises(DataError) as excinfo:
        load_mnist(tmp_path, "train")
    assert_names(excinfo, image_path)


def test_mnist_count_mismatch(tmp_path):
    write_mnist(tmp_path)
    label_path = tmp_path / "train-labels-idx1-ubyte"
    label_path.write_bytes(idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(DataError, match="4 labels") as excinfo:
        load_mnist(tmp_path, "train")
    assert_names(excinfo, label_path)


# ---------------------------------------------------------------- CIFAR

def cifar_arrays(n, which, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, which, n).astype(np.uint8)


def write_cifar(folder, which, fmt, n=3):
    """Writes every batch of one CIFAR distribution; returns {split: (data, labels)}."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]} if which == 10 \
        else {"train": ["train"], "test": ["test"]}
    written = {}
    for split, batch_names in names.items():
        parts = []
        for k, name in enumerate(batch_names):
            data, labels = cifar_arrays(n, which, seed=len(parts) + 10 * (split == "test"))
            parts.append((data, labels))
            if fmt == "bin":
                coarse = (labels // 5)[:, None]
                label_cols = labels[:, None] if which == 10 else np.hstack([coarse, labels[:, None]])
                (folder / f"{name}.bin").write_bytes(np.hstack([label_cols, data]).tobytes())
            else:
                key = b"labels" if which == 10 else b"fine_labels"
                batch = {b"data": data, key: labels.tolist(), b"coarse_labels": [0] * n}
                (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[split] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return written


@pytest.mark.parametrize("which", [10, 100])
@pytest.mark.parametrize("fmt", ["bin", "py"])
def test_cifar_round_trip(tmp_path, which, fmt):
    written = write_cifar(tmp_path, which, fmt)
    for split in ("train", "test"):
        ds = load_cifar(tmp_path, split, which)
        data, labels = written[split]
        assert ds.shape == (3, 32, 32) and ds.num_classes == which and len(ds) == len(labels)
        np.testing.assert_allclose(ds.images.reshape(len(ds), -1), data / 255.0, atol=1e-7)
        np.testing.assert_array_equal(ds.labels, labels)
    assert len(load(f"cifar{which}:{tmp_path}", "train")) == (15 if which == 10 else 3)


@pytest.mark.parametrize("which,sub,fmt", [(10, "cifar-10-batches-bin", "bin"), (10, "cifar-10-batches-py", "py"),
                                           (100, "cifar-100-binary", "bin"), (100, "cifar-100-python", "py")])
def test_cifar_subfolders(tmp_path, which, sub, fmt):
    write_cifar(tmp_path / sub, which, fmt)
    assert len(load_cifar(tmp_path, "test", which)) == 3


def test_cifar_missing(tmp_path):
    with pytest.raises(DataError, match="data_batch_1.bin") as excinfo:
        load_cifar(tmp_path, "train", 10)
    assert_names(excinfo, tmp_path)
    write_cifar(tmp_path, 10, "bin")
    (tmp_path / "data_batch_3.bin").unlink()
    with pytest.raises(DataError, match="missing") as excinfo:
        load_cifar(tmp_path, "train", 10)
    assert_names(excinfo, tmp_path / "data_batch_3.bin")


def test_cifar_truncated_binary(tmp_path):
    write_cifar(tmp_path, 100, "bin")
    path = tmp_path / "test.bin"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="records") as excinfo:
        load_cifar(tmp_path, "test", 100)
    assert_names(excinfo, path)


@pytest.mark.parametrize("content", [b"not a pickle at all", None, b"truncated"])
def test_cifar_corrupt_pickle(tmp_path, content):
    write_cifar(tmp_path, 10, "py")
    path = tmp_path / "test_batch"
    raw = path.read_bytes()
    if content is None:  # a valid pickle of something that is not a batch
        content = pickle.dumps([1, 2, 3])
    elif content == b"truncated":
        content = raw[: len(raw) // 2]
    path.write_bytes(content)
    with pytest.raises(DataError) as excinfo:
        load_cifar(tmp_path, "test", 10)
    assert_names(excinfo, path)


def test_cifar_pickle_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": Evil()}))
    with pytest.raises(DataError, match="refusing"):
        load_cifar(tmp_path, "test", 10)


# ---------------------------------------------------------------- ImageFolder

COLORS = {"cat": (255, 0, 0), "dog": (0, 255, 0), "ant": (0, 0, 255)}


def write_folder(root, per_class=2, size=(10, 6)):
    for cls, color in COLORS.items():
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", size, color).save(root / cls / f"{i}.png")
    (root / "cat" / "notes.txt").write_text("ignored")


def test_image_folder(tmp_path):
    write_folder(tmp_path)
    ds = load_image_folder(tmp_path, size=8)
    assert ds.shape == (3, 8, 8) and len(ds) == 6 and ds.num_classes == 3
    np.testing.assert_array_equal(ds.labels, [0, 0, 1, 1, 2, 2])  # ant, cat, dog
    np.testing.assert_allclose(ds.images[0, :, 3, 3], [0, 0, 1])
    np.testing.assert_allclose(ds.images[2, :, 3, 3], [1, 0, 0])
    assert load(f"imagefolder:{tmp_path}", "test").shape == (3, 32, 32)


def test_image_folder_splits(tmp_path):
    write_folder(tmp_path / "train", per_class=2)
    write_folder(tmp_path / "val", per_class=1)
    assert len(load_image_folder(tmp_path, 4, "train")) == 6
    assert len(load_image_folder(tmp_path, 4, "test")) == 3
    assert len(load_image_folder(tmp_path, 4)) == 6


def test_image_folder_unreadable(tmp_path):
    write_folder(tmp_path)
    bad = tmp_path / "dog" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DataError, match="unreadable") as excinfo:
        load_image_folder(tmp_path, 8)
    assert_names(excinfo, bad)


def test_image_folder_empty(tmp_path):
    with pytest.raises(DataError, match="no .png"):
        load_image_folder(tmp_path, 8)


# ---------------------------------------------------------------- DataLoader

def small_dataset(n=10, shape=(3, 6, 6)):
    images = np.arange(n * int(np.prod(shape)), dtype=np.float32).reshape(n, *shape)
    return Dataset(images, np.arange(n), n, "toy")


def collect(loader):
    return [(x.copy(), y.copy()) for x, y in loader]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_loader_deterministic_and_epochs_differ():
    ds = small_dataset()
    a, b = DataLoader(ds, 3, seed=7), DataLoader(ds, 3, seed=7)
    first = collect(a)
    assert_same_batches(first, collect(b))
    assert a.epoch == 1
    second = collect(a)
    assert not np.array_equal(np.concatenate([y for _, y in first]), np.concatenate([y for _, y in second]))
    a.set_epoch(0)
    assert_same_batches(collect(a), first)
    c = DataLoader(ds, 3, seed=7, prefetch=0)
    assert_same_batches(collect(c), first)


def test_loader_batches_cover_dataset_and_dtypes():
    ds = small_dataset()
    batches = collect(DataLoader(ds, 4))
    assert [len(y) for _, y in batches] == [4, 4, 2]
    labels = np.concatenate([y for _, y in batches])
    assert sorted(labels) == list(range(10))
    for x, y in batches:
        assert x.dtype == np.float32 and x.flags.c_contiguous and y.dtype == np.int64
        np.testing.assert_array_equal(x, ds.images[y])


def test_loader_len_drop_last_and_no_shuffle():
    ds = small_dataset()
    assert len(DataLoader(ds, 4)) == 3
    loader = DataLoader(ds, 4, drop_last=True, shuffle=False)
    assert len(loader) == 2
    batches = collect(loader)
    assert len(batches) == 2
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), np.arange(8))


def test_loader_normalization():
    ds = small_dataset(4)
    mean, std = [1.0, 2.0, 3.0], [2.0, 4.0, 8.0]
    (x, y), = collect(DataLoader(ds, 4, shuffle=False, mean=mean, std=std))
    expected = (ds.images - np.array(mean, np.float32)[:, None, None]) / np.array(std, np.float32)[:, None, None]
    np.testing.assert_allclose(x, expected, rtol=1e-6)
    with pytest.raises(DataError):
        DataLoader(ds, 4, mean=[0.0], std=[0.0])
    with pytest.raises(DataError, match="1 or 3 values"):
        DataLoader(ds, 4, mean=[0.5, 0.5], std=[1.0])


def test_loader_augmentation_deterministic_and_valid():
    ds = small_dataset(8, (1, 6, 6))
    ds.images += 1.0  # so zero padding is distinguishable from data
    a = collect(DataLoader(ds, 8, shuffle=False, augment=True, seed=3))
    b = collect(DataLoader(ds, 8, shuffle=False, augment=True, seed=3))
    assert_same_batches(a, b)
    x, y = a[0]
    assert x.shape == ds.images.shape
    assert not np.array_equal(x, ds.images)
    for img, label in zip(x, y):
        padded = np.pad(ds.images[label], ((0, 0), (4, 4), (4, 4)))
        candidates = [padded[:, dy:dy + 6, dx:dx + 6] for dy in range(9) for dx in range(9)]
        candidates += [c[:, :, ::-1] for c in candidates]
        assert any(np.array_equal(img, c) for c in candidates)


def test_loader_early_break_stops_thread():
    ds = small_dataset(50)
    before = threading.active_count()
    loader = DataLoader(ds, 2, prefetch=2)
    for _ in loader:
        break
    assert threading.active_count() == before
    it = iter(loader)
    next(it)
    assert threading.active_count() == before + 1
    it.close()
    assert threading.active_count() == before
    assert loader.epoch == 0  # an abandoned pass does not advance the epoch


class Exploding:
    def __getitem__(self, idx):
        raise RuntimeError("disk on fire")


class ExplodingDataset:
    images, labels = Exploding(), np.zeros(6, np.int64)

    def __len__(self):
        return 6


def test_loader_worker_exception_reraised():
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="disk on fire"):
        for _ in DataLoader(ExplodingDataset(), 2):
            pass
    assert threading.active_count() == before


def test_loader_state_dict_resume():
    ds = small_dataset()
    a = DataLoader(ds, 3, seed=11)
    collect(a)
    state = a.state_dict()
    assert state == {"epoch": 1, "seed": 11}
    b = DataLoader(ds, 3, seed=0)
    b.load_state_dict(state)
    assert_same_batches(collect(a), collect(b))


# ---------------------------------------------------------------- values out of range

@pytest.mark.parametrize("spec,words", [("synthetic:0x32x32", "shape 0x32x32"), ("synthetic:3x32x0", "shape 3x32x0"),
                                        ("synthetic:3x32x32:n=0", "n=0"), ("synthetic:3x8x8:classes=0", "0 classes")])
def test_synthetic_sizes_must_be_positive(spec, words):
    with pytest.raises(DataError, match="synthetic data needs") as excinfo:
        load(spec)
    assert words in str(excinfo.value)


@pytest.mark.parametrize("size", [0, -5])
def test_image_size_must_be_positive(size):
    with pytest.raises(DataError, match=f"image size must be a positive number of pixels, got {size}"):
        load("synthetic:1x8x8:n=4", size=size)


def test_negative_pad_is_refused():
    with pytest.raises(DataError, match="pad .* must be >= 0, got -1"):
        DataLoader(small_dataset(), 2, augment="crop", pad=-1)


def test_image_folder_with_an_empty_class_folder_is_refused(tmp_path):
    write_folder(tmp_path)
    (tmp_path / "bee").mkdir()                       # sorts first: it would be class 0, with no image
    (tmp_path / "bee" / "readme.txt").write_text("no images here")
    with pytest.raises(DataError, match="class folder has no .png/.jpg/.jpeg images") as excinfo:
        load_image_folder(tmp_path, 8)
    assert_names(excinfo, tmp_path / "bee")


# ---------------------------------------------------------------- issue 31: data that would train on nothing or on shifted labels

@pytest.mark.parametrize("split", ["train", "test"])
def test_mnist_files_with_no_images_are_refused_naming_the_file(tmp_path, split):
    """Before: 0 training steps and a "final test accuracy" of an untrained network."""
    _, _, (image_path, _) = write_mnist(tmp_path, split, n=0)
    with pytest.raises(DataError, match="no images") as excinfo:
        load(f"mnist:{tmp_path}", split)
    assert_names(excinfo, image_path)


def test_a_test_folder_lacking_a_class_keeps_the_training_labels(tmp_path):
    """Labels are the training classes' in every split: a test/ without "ant" must not make "cat"
    label 0 (before: every test label shifted, and an accuracy of 0.00%)."""
    write_folder(tmp_path / "train", per_class=2)
    write_folder(tmp_path / "test", per_class=1)
    for f in (tmp_path / "test" / "ant").iterdir():
        f.unlink()
    (tmp_path / "test" / "ant").rmdir()
    train, test = load_image_folder(tmp_path, 4, "train"), load_image_folder(tmp_path, 4, "test")
    assert train.num_classes == test.num_classes == 3
    np.testing.assert_array_equal(train.labels, [0, 0, 1, 1, 2, 2])     # ant, cat, dog
    np.testing.assert_array_equal(test.labels, [1, 2])                  # cat, dog: as in train/
    np.testing.assert_allclose(test.images[0, :, 1, 1], [1, 0, 0])      # the red one is the cat


def test_a_test_folder_with_a_class_the_training_folder_lacks_is_refused(tmp_path):
    write_folder(tmp_path / "train")
    write_folder(tmp_path / "test")
    (tmp_path / "test" / "zebra").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "test" / "zebra" / "0.png")
    with pytest.raises(DataError, match="class 'zebra' has no folder in") as excinfo:
        load_image_folder(tmp_path, 4, "test")
    assert_names(excinfo, tmp_path / "test" / "zebra")


@pytest.mark.parametrize("spec,size", [("digits", 100000), ("digits", 256), ("synthetic:1x8x8:n=4", 4096),
                                       ("imagefolder", 2048)])
def test_an_image_size_beyond_the_memory_is_one_clear_error(tmp_path, monkeypatch, spec, size):
    """--image-size 100000: before, a MemoryError traceback (or the machine swapping until the process is
    killed). The machine here is made to have 64 MiB, so the sizes below 100000 would fit a real one."""
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 16384 if name == "SC_PHYS_PAGES" else
                        4096 if name == "SC_PAGE_SIZE" else real(name))
    if spec == "imagefolder":
        write_folder(tmp_path)
        spec = f"imagefolder:{tmp_path}"
    with pytest.raises(DataError, match=rf"of [13]x{size}x{size} would take") as excinfo:
        load(spec, "train", size=size)
    message = str(excinfo.value)
    assert "more than this machine's 64.00 MiB of memory" in message and "smaller image size" in message
    assert "\n" not in message


def test_image_folders_without_pillow_are_one_line_naming_what_to_install(tmp_path, monkeypatch):
    write_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "PIL", None)          # import PIL fails, as when missing
    with pytest.raises(DataError, match="needs Pillow.*pip install pillow") as excinfo:
        load(f"imagefolder:{tmp_path}", "train")
    assert "\n" not in str(excinfo.value)
