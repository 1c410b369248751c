"""The training workflow behind ``minidnn train`` and ``minidnn.fit/evaluate/save/load``: epochs,
evaluation, logs, checkpoints, resume.

A checkpoint holds everything a run depends on - weights and BN statistics,
the inputs' normalization, optimizer state, the trainer's random stream, the
epoch, the batch within it and the losses of that epoch so far - so a resumed
run repeats the uninterrupted one's losses and final parameters exactly. The
model's state is stored under its own keys (what ``net.load_state_dict``
takes), the optimizer's beside it in the same file as ``optim.<parameter>.<state>``;
checkpoints of format 1 (the model's keys under ``model.``) still load.

Ctrl-C is deferred to the end of the running step (a checkpoint never holds a
half-applied update); a second Ctrl-C stops at once and keeps the previous
checkpoint.
"""
from __future__ import annotations

import inspect
import json
import os
import signal
import threading
import time
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from .checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from .data import DataLoader, Normalization
from .errors import CheckpointError, ConfigError, MinidnnError
from .run_folder import RunFolder

FORMAT = 2              # 1: the model's state under "model.<key>"; 2: under its own keys
_OPTIM = "optim."       # optimizer state: "optim.<parameter>.<state name>"


def build_model(name, **kwargs):
    """Build registered model ``name``, passing only the keyword arguments its factory names.

    Not every factory takes ``in_channels`` or ``image_size`` (a ResNet adapts
    to any size; AlexNet is made for 224); those it lacks are dropped, and a
    size or channel count the network cannot take fails when it is traced.
    """
    from . import models
    info = models.info(name)
    accepted = inspect.signature(info.factory).parameters
    return info.build(**{k: v for k, v in kwargs.items() if k in accepted and v is not None})


def evaluate(trainer, loader):
    """Top-1 accuracy of ``trainer``'s network (eval mode) over ``loader``'s (x, y) batches.

    The trainer applies its own input normalization (``compile(normalize=...)``, or the one
    :func:`load` restored); a :class:`~minidnn.data.DataLoader` that normalizes too is refused."""
    if isinstance(loader, DataLoader) and loader.normalization is not None and trainer.normalization is not None:
        raise ConfigError("evaluate: the trainer normalizes its inputs (compile(normalize=...) or a loaded "
                          "checkpoint) and the DataLoader does too (mean=, std=): they would be normalized "
                          "twice; give the DataLoader no mean and std")
    correct = total = 0
    for x, y in loader:
        logits = trainer.predict(x)
        correct += int((logits.argmax(axis=1) == y).sum())
        total += len(y)
    return correct / max(total, 1)


def _host(a):
    # CuPy arrays copy to the host with .get(); NumPy arrays are already there.
    return np.require(a.get() if hasattr(a, "get") else a, requirements="C")


def _optimizer_states(trainer):
    """``optim.<param>.<state>`` -> (parameter, state name), for every state tensor the optimizer keeps."""
    if trainer.optimizer is None:
        return {}
    return {f"{_OPTIM}{pname}.{n}": (p, n) for pname, p in trainer.net.named_parameters() if p.grad is not None
            for n in trainer.optimizer.state_names}


def checkpoint_tensors(trainer):
    """The model's state_dict under its own keys and the optimizer's state (``optim.<param>.<state>``),
    as host arrays."""
    tensors = {k: _host(v) for k, v in trainer.net.state_dict().items()}
    clash = next((k for k in tensors if k.startswith(_OPTIM)), None)
    if clash is not None:
        raise CheckpointError(f"cannot save {clash!r}: a checkpoint keeps optimizer state under {_OPTIM!r}, "
                              "so a top-level module may not be named 'optim'")
    for key, (p, n) in _optimizer_states(trainer).items():
        tensors[key] = _host(trainer.store.optimizer_state(p, n))
    return tensors


def save(path, trainer, schedule=None, model_name="model", epoch=0, batch=0, extra=None):
    """Write ``trainer`` to the checkpoint ``path`` (one safetensors file, replaced atomically).

    It keeps the model's state_dict under its own keys, the input normalization, the
    optimizer's state and hyperparameters, the step count and random stream, and
    ``schedule``'s state, so :func:`load` resumes exactly. ``epoch`` and ``batch`` say
    where :func:`fit` resumes (that batch of that epoch); ``extra`` (JSON-able) is stored too.
    """
    opt = trainer.optimizer
    meta = {"format": FORMAT, "model": model_name, "epoch": epoch, "batch": batch, "steps_done": trainer.steps_done,
            "rng": rng_state(trainer.rng), "optimizer": opt.state_dict() if opt is not None else {},
            "normalization": trainer.normalization.to_dict() if trainer.normalization is not None else None,
            "schedule": schedule.state_dict() if schedule is not None else None, **(extra or {})}
    if opt is not None:
        meta["optimizer_type"] = type(opt).__name__
    meta["precision"] = trainer.precision.name          # the master weights are fp32 whatever it is
    if trainer.scaler is not None:                      # fp16: the loss scale and its counters
        meta["grad_scaler"] = trainer.scaler.state_dict()
    save_checkpoint(path, checkpoint_tensors(trainer), meta)


class Checkpoint(NamedTuple):
    """A training checkpoint read from ``path``: its tensors and metadata."""

    path: str
    tensors: dict
    meta: dict


_REQUIRED = {"model": str, "epoch": int, "batch": int, "steps_done": int, "rng": dict, "optimizer": dict}
_OPTIONAL = {"format": int, "optimizer_type": str, "schedule": (dict, type(None)), "config": dict,
             "normalization": (dict, type(None)), "epoch_losses": list, "precision": str, "grad_scaler": dict}


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_meta(path, meta):
    """CheckpointError naming the first field of ``meta`` a training checkpoint cannot have."""
    for key in _REQUIRED:
        if key not in meta:
            raise CheckpointError(f"{path}: not a minidnn training checkpoint (no {key!r} in its metadata)")
    version = meta.get("format", 1)
    if type(version) is int and version > FORMAT:
        raise CheckpointError(f"{path}: written by a newer minidnn (checkpoint format {version}; this one reads "
                              f"formats 1 to {FORMAT}): upgrade minidnn")
    numbers = {"epoch_losses": lambda v: all(_is_number(x) for x in v),
               "optimizer": lambda v: all(isinstance(x, (int, float)) for x in v.values()),
               "schedule": lambda v: v is None or all(_is_number(x) for x in v.values()),
               "normalization": lambda v: v is None or all(isinstance(v.get(k), list) and
                                                           all(_is_number(x) for x in v[k]) for k in ("mean", "std")),
               "format": lambda v: v >= 1,
               "config": lambda v: all(isinstance(x, (str, int, float, bool, type(None))) for x in v.values())}
    for key, kind in {**_REQUIRED, **_OPTIONAL}.items():
        if key not in meta:
            continue
        v = meta[key]
        ok = isinstance(v, kind) and not (kind is int and (isinstance(v, bool) or v < 0))
        if not ok or not numbers.get(key, lambda _: True)(v):
            raise CheckpointError(f"{path}: not a minidnn training checkpoint ({key!r} is {repr(v)[:80]})")


def read_checkpoint(path, model_name=None) -> Checkpoint:
    """Read a training checkpoint; CheckpointError if it is not one, or is for another model than ``model_name``.

    The CLI reads it before loading data or building anything, so a wrong file fails at once.
    """
    path = os.fspath(path)
    tensors, meta = load_checkpoint(path)
    _check_meta(path, meta)
    if model_name is not None and meta["model"] != model_name:
        raise CheckpointError(f"{path}: checkpoint is for model {meta['model']!r}, not {model_name!r}")
    return Checkpoint(path, tensors, meta)


def model_state(ckpt):
    """A :class:`Checkpoint`'s model state_dict under the model's own keys (format 1 kept them under
    ``model.``), which ``net.load_state_dict`` takes."""
    if ckpt.meta.get("format", 1) == 1:
        return {k[len("model."):]: v for k, v in ckpt.tensors.items() if k.startswith("model.")}
    return {k: v for k, v in ckpt.tensors.items() if not k.startswith(_OPTIM)}


def load_weights(ckpt, net):
    """Copy a :class:`Checkpoint`'s model state into ``net``; CheckpointError if it does not fit."""
    try:
        net.load_state_dict(model_state(ckpt))
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{ckpt.path}: does not fit the model: {' '.join(str(e).split())}") from None


def _normalization(ckpt, trainer):
    """The checkpoint's input normalization, checked against ``trainer``'s inputs; the trainer's own
    where a format-1 checkpoint does not say (the CLI's kept one; ``fit``'s did not)."""
    if "normalization" not in ckpt.meta:
        return trainer.normalization
    shape = trainer.input_shape
    try:
        return Normalization.of(ckpt.meta["normalization"], shape[1] if len(shape) > 1 else None,
                                "its normalization")
    except MinidnnError as e:
        raise CheckpointError(f"{ckpt.path}: {e}") from None


def restore(source, trainer, schedule=None, model_name=None, reset_optimizer=False, precision_change=False):
    """Load a checkpoint (a path or a :class:`Checkpoint`) into ``trainer``; with ``model_name``, it
    must be that model's.

    Every optimizer state tensor the trainer keeps must be in the checkpoint
    (else momentum would silently restart): CheckpointError names the missing
    ones, unless ``reset_optimizer`` asks to start the optimizer's state afresh
    (zeros, and the step count its bias corrections use restarts too). A trainer
    without an optimizer (one compiled to evaluate) takes the weights, BatchNorm
    statistics and normalization only. A checkpoint trained in another precision (its ``precision``;
    fp32 if it names none) is refused unless ``precision_change`` (``minidnn train --precision``
    given explicitly); fp16's loss scale and counters are restored with it.
    Returns its metadata (epoch, batch, steps_done, ...).
    """
    ckpt = source if isinstance(source, Checkpoint) else read_checkpoint(source, model_name)
    path, tensors, meta = ckpt
    if model_name is not None and meta["model"] != model_name:
        raise CheckpointError(f"{path}: checkpoint is for model {meta['model']!r}, not {model_name!r}")
    normalization = _normalization(ckpt, trainer)
    if trainer.optimizer is None:
        load_weights(ckpt, trainer.net)
        trainer.normalization = normalization
        return meta
    saved_precision = meta.get("precision", "fp32")
    if saved_precision != trainer.precision.name and not precision_change:
        raise CheckpointError(f"{path}: checkpoint was trained in precision {saved_precision}, this trainer is "
                              f"{trainer.precision.name}: compile with precision={saved_precision!r}, or change it on "
                              f"purpose (precision_change=True; minidnn train --precision {trainer.precision.name})")
    kind = type(trainer.optimizer).__name__
    if meta.get("optimizer_type", kind) != kind:
        raise CheckpointError(f"{path}: checkpoint was trained with {meta['optimizer_type']}, not {kind}")
    states = _optimizer_states(trainer)
    missing = [key for key in states if key not in tensors]
    if missing and not reset_optimizer:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(f"{path}: incomplete optimizer state: {missing[0]}{more} missing; resume with "
                              "--reset-optimizer (reset_optimizer=True) to restart the optimizer's state on purpose")
    for key, (p, n) in states.items():
        if not reset_optimizer and tensors[key].shape != tuple(p.shape):
            raise CheckpointError(f"{path}: {key} has shape {tensors[key].shape}, the model's is {tuple(p.shape)}")
    load_weights(ckpt, trainer.net)
    names = trainer.optimizer.state_names
    try:
        trainer.optimizer.load_state_dict(meta["optimizer"])
        if schedule is not None and meta.get("schedule"):
            schedule.load_state_dict(meta["schedule"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: optimizer or schedule state does not fit ({type(e).__name__}: {e})") from None
    if trainer.optimizer.state_names != names:     # e.g. SGD compiled without momentum, the checkpoint's with
        raise CheckpointError(f"{path}: the checkpoint's {kind} keeps state {trainer.optimizer.state_names}, the "
                              f"trainer's {names}: compile with the checkpoint's hyperparameters (e.g. its momentum)")
    for key, (p, n) in states.items():
        trainer.store.optimizer_state(p, n)[...] = 0 if reset_optimizer else tensors[key]
    try:
        trainer.rng = restore_rng(meta["rng"])
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if trainer.scaler is not None and isinstance(meta.get("grad_scaler"), dict):
        try:
            trainer.scaler.load_state_dict(meta["grad_scaler"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: its grad_scaler state does not fit ({type(e).__name__}: {e})") from None
    trainer.steps_done = meta["steps_done"]
    trainer.normalization = normalization
    if reset_optimizer:
        trainer.optimizer.state_start = trainer.steps_done
    return meta


def load(path, trainer=None, schedule=None, reset_optimizer=False, precision_change=False):
    """Read a checkpoint written by :func:`save`, :func:`fit` or ``minidnn train``.

    Without ``trainer``: the model's state_dict (name -> array), which ``net.load_state_dict``
    takes. With one (compiled on the same network): its weights and BatchNorm statistics
    and the input normalization that ``step``, ``predict`` and :func:`evaluate` then apply;
    if it has an optimizer, also the optimizer's state and hyperparameters, the step
    count, the random stream and ``schedule``'s state, so its next ``step`` is the one the
    saved trainer would have taken (``reset_optimizer``: :func:`restore`'s). Returns ``trainer``.
    """
    ckpt = read_checkpoint(path)
    if trainer is None:
        return model_state(ckpt)
    restore(ckpt, trainer, schedule, reset_optimizer=reset_optimizer, precision_change=precision_change)
    return trainer


class _Interrupts:
    """Turns the first Ctrl-C into a request the loop honours between steps.

    Only the main thread may install signal handlers; elsewhere, and where
    SIGINT is ignored, Ctrl-C keeps its behaviour.
    """

    def __init__(self):
        self.requested = self.forced = False
        self._previous, self._installed = None, False

    def _handle(self, signum, frame):
        if self.requested:
            self.forced = True
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        # Not off the main thread (Python forbids it), nor where Ctrl-C is ignored (nohup, `cmd &`).
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous, self._installed = signal.signal(signal.SIGINT, self._handle), True
        return self

    def __exit__(self, *exc):
        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)


def _truncate_jsonl(path, key, limit):
    """Drop records whose ``key`` exceeds ``limit``: a resumed run rewrites what came after its checkpoint."""
    if not path or not os.path.isfile(path):
        return
    with open(path) as f:
        lines = [ln for ln in f if ln.strip()]
    keep = []
    for ln in lines:
        try:
            record = json.loads(ln)
        except ValueError:
            continue                    # a line cut short by a killed process
        if record.get(key, 0) <= limit:
            keep.append(ln if ln.endswith("\n") else ln + "\n")
    if keep != lines:
        with open(path, "w") as f:
            f.writelines(keep)


def fit(trainer, train_loader, test_loader=None, epochs=1, schedule=None, out_dir=None, model_name=None,
        resume=None, progress=True, log=print, on_step=None, metrics_path=None, run_info=None,
        reset_optimizer=False, overwrite=False, precision_change=False):
    """Train for ``epochs`` over ``train_loader`` (a :class:`~minidnn.data.DataLoader`); each epoch
    ends with a test accuracy (with ``test_loader``), a metrics line and a checkpoint.

    The inputs' normalization is the trainer's (``compile(normalize=(mean, std))``), so
    checkpoints keep it: loaders that normalize (``mean=``, ``std=``) are refused.
    ``schedule`` (an lr schedule) steps once per epoch.

    With ``out_dir``: ``checkpoint.safetensors`` (every epoch and on Ctrl-C),
    ``steps.jsonl`` (one line per step: epoch, batch, step, loss, lr) and, unless
    ``metrics_path`` says otherwise, ``metrics.jsonl`` (one line per epoch). The
    folder is locked while ``fit`` runs, and one holding another run's files is
    refused unless ``resume`` continues that run from its own checkpoint or
    ``overwrite`` replaces it (:class:`~minidnn.run_folder.RunFolder`; a folder
    the caller has claimed already is taken as it is).
    ``resume`` is a checkpoint path or a :class:`Checkpoint`; the
    consumed batches of its epoch are drawn again and skipped, so the loader's
    shuffle and augmentation stay in step; ``reset_optimizer`` is :func:`restore`'s.
    ``model_name`` is stored in the checkpoints (default "model") and, given, a resumed
    checkpoint must be that model's.
    ``run_info`` (a JSON-able dict) is stored in every checkpoint. Ctrl-C saves a
    checkpoint at the batch reached and re-raises KeyboardInterrupt. Returns the
    list of per-epoch metrics.
    """
    for loader in (train_loader, test_loader):
        if isinstance(loader, DataLoader) and loader.normalization is not None:
            raise ConfigError("fit: a DataLoader normalizes its batches (mean=, std=), outside the model, so "
                              "checkpoints would not keep it: give the trainer the normalization "
                              "(compile(..., normalize=(mean, std))) and the loaders none")
    if out_dir is not None and not isinstance(out_dir, RunFolder):
        where = resume.path if isinstance(resume, Checkpoint) else resume
        with RunFolder(out_dir, metrics_path) as folder:
            folder.claim(where, overwrite)
            if overwrite:
                folder.clear()
            return fit(trainer, train_loader, test_loader, epochs, schedule, folder, model_name, resume, progress,
                       log, on_step, metrics_path, run_info, reset_optimizer, precision_change=precision_change)
    out_dir = os.fspath(out_dir) if out_dir is not None else None
    loop = _Loop(trainer, schedule, model_name or "model", out_dir, metrics_path, run_info, progress, log, on_step)
    start_epoch, skip, carried = 0, 0, []
    if resume is not None:
        meta = restore(resume, trainer, schedule, model_name, reset_optimizer, precision_change)
        start_epoch, skip, carried = meta["epoch"], meta["batch"], list(meta.get("epoch_losses", []))
        if skip > len(train_loader):
            where = resume.path if isinstance(resume, Checkpoint) else os.fspath(resume)
            raise CheckpointError(f"{where}: stopped at batch {skip} of epoch {start_epoch + 1}, past the end of "
                                  f"an epoch of {len(train_loader)} batches: the data set or batch size differ "
                                  "from the run that wrote it")
        _truncate_jsonl(loop.steps_path, "step", trainer.steps_done)
        _truncate_jsonl(loop.metrics_path, "epoch", start_epoch)
        log(f"resumed: epoch {start_epoch + 1}, batch {skip} (step {trainer.steps_done})")
    history = []
    with loop, _Interrupts() as loop.interrupts:
        for epoch in range(start_epoch, epochs):
            t0 = time.perf_counter()
            losses = loop.epoch(train_loader, epoch, epochs, skip, carried)
            skip, carried = 0, []
            lr, peak = trainer.optimizer.lr, loop.peak_bytes     # of the training steps, not of evaluation
            if schedule is not None:
                schedule.step()
            acc = evaluate(trainer, test_loader) if test_loader is not None else None
            m = {"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else None, "test_accuracy": acc,
                 "seconds": round(time.perf_counter() - t0, 3), "lr": lr, "peak_bytes": peak}
            history.append(m)
            log(f"epoch {epoch + 1:>3}/{epochs}  " + (f"loss {m['loss']:.4f}  " if losses else "")
                + (f"test acc {acc * 100:.2f}%  " if acc is not None else "") + f"({m['seconds']:.1f} s)")
            loop.end_epoch(m)
    return history


class _Loop:
    """The state one :func:`fit` call shares between epochs: where to write, whom to tell, Ctrl-C."""

    def __init__(self, trainer, schedule, model_name, out_dir, metrics_path, run_info, progress, log, on_step):
        self.trainer, self.schedule, self.model_name = trainer, schedule, model_name
        self.run_info, self.progress, self.log, self.on_step = run_info or {}, progress, log, on_step
        self.ckpt = os.path.join(out_dir, "checkpoint.safetensors") if out_dir else None
        self.steps_path = os.path.join(out_dir, "steps.jsonl") if out_dir else None
        self.metrics_path = metrics_path or (os.path.join(out_dir, "metrics.jsonl") if out_dir else None)
        for d in {os.path.dirname(p) for p in (self.ckpt, self.metrics_path) if p}:
            os.makedirs(d or ".", exist_ok=True)
        self.steps_log, self.interrupts, self.peak_bytes = None, None, 0

    def __enter__(self):
        self.steps_log = open(self.steps_path, "a", buffering=1) if self.steps_path else None
        return self

    def __exit__(self, *exc):
        if self.steps_log:
            self.steps_log.close()

    def epoch(self, loader, epoch, epochs, skip, losses):
        """One pass over ``loader`` from batch ``skip``, appending to ``losses``; returns ``losses``."""
        trainer, done, self.peak_bytes = self.trainer, skip, 0
        loader.set_epoch(epoch)
        bar = tqdm(total=len(loader), initial=skip, desc=f"epoch {epoch + 1}/{epochs}",
                   disable=not self.progress, leave=False, dynamic_ncols=True)
        try:
            for batch, (x, y) in enumerate(loader):
                if batch < skip:
                    continue            # drawn, not sliced: the loader's random stream advances as before
                before = trainer.steps_done
                try:
                    loss = trainer.step(x, y)
                except KeyboardInterrupt:
                    # A step that finished (steps_done moved) counts; one that did not runs again on resume.
                    done = batch + (trainer.steps_done > before)
                    raise
                done = batch + 1
                losses.append(loss)
                self.peak_bytes = max(self.peak_bytes, trainer.measured_peak_bytes)
                if self.steps_log:
                    self.steps_log.write(json.dumps({"epoch": epoch + 1, "batch": batch, "step": trainer.steps_done,
                                                     "loss": loss, "lr": trainer.optimizer.lr}) + "\n")
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
                if self.on_step is not None:
                    self.on_step(epoch, batch, loss)
                if self.interrupts.requested:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            bar.close()
            if self.interrupts.forced:
                self.log("interrupted during a step: checkpoint not updated")
            elif self.ckpt:
                save(self.ckpt, trainer, self.schedule, self.model_name, epoch, done,
                     {**self.run_info, "epoch_losses": losses})
                self.log(f"interrupted: checkpoint saved to {self.ckpt} (epoch {epoch + 1}, batch {done})")
            raise
        bar.close()
        return losses

    def end_epoch(self, metrics):
        """Append the epoch's metrics, checkpoint at the start of the next epoch, honour a pending Ctrl-C."""
        if self.metrics_path:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(metrics) + "\n")
        if self.ckpt:
            save(self.ckpt, self.trainer, self.schedule, self.model_name, metrics["epoch"], 0, self.run_info)
        if self.interrupts.requested:   # Ctrl-C came during evaluation: stop at this checkpoint
            self.log(f"interrupted: checkpoint saved to {self.ckpt} (end of epoch {metrics['epoch']})"
                     if self.ckpt else "interrupted")
            raise KeyboardInterrupt
