"""The training loop behind ``minidnn train``: epochs, evaluation, metrics, checkpoints, resume.

A checkpoint holds everything a run depends on - weights and BN statistics,
optimizer state, the trainer's random stream, the epoch and the batch within
it - so a resumed run repeats the uninterrupted one's losses exactly.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
from tqdm import tqdm

from .checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from .errors import CheckpointError


def evaluate(trainer, loader):
    """(mean loss is not computed in eval mode) -> accuracy over ``loader``."""
    correct = total = 0
    for x, y in loader:
        logits = trainer.predict(x)
        correct += int((logits.argmax(axis=1) == y).sum())
        total += len(y)
    return correct / max(total, 1)


def checkpoint_tensors(trainer):
    tensors = {f"model.{k}": np.require(v, requirements="C") for k, v in trainer.net.state_dict().items()}
    names = trainer.optimizer.state_names
    for pname, p in trainer.net.named_parameters():
        if p.grad is None:
            continue
        for n in names:
            tensors[f"optim.{pname}.{n}"] = np.require(trainer.store.optimizer_state(p, n), requirements="C")
    return tensors


def save(path, trainer, schedule, model_name, epoch, batch, extra=None):
    meta = {"format": 1, "model": model_name, "epoch": epoch, "batch": batch, "steps_done": trainer.steps_done,
            "rng": rng_state(trainer.rng), "optimizer": trainer.optimizer.state_dict(),
            "schedule": schedule.state_dict() if schedule is not None else None, **(extra or {})}
    save_checkpoint(path, checkpoint_tensors(trainer), meta)


def restore(path, trainer, schedule, model_name):
    """Load a checkpoint into ``trainer``; returns its metadata (epoch, batch, ...)."""
    tensors, meta = load_checkpoint(path)
    if meta.get("model") != model_name:
        raise CheckpointError(f"{path}: checkpoint is for model {meta.get('model')!r}, not {model_name!r}")
    sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        trainer.net.load_state_dict(sd)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{path}: does not fit the model: {e}") from None
    for pname, p in trainer.net.named_parameters():
        for n in trainer.optimizer.state_names:
            key = f"optim.{pname}.{n}"
            if key in tensors and p.grad is not None:
                trainer.store.optimizer_state(p, n)[...] = tensors[key]
    trainer.optimizer.load_state_dict(meta["optimizer"])
    if schedule is not None and meta.get("schedule"):
        schedule.load_state_dict(meta["schedule"])
    trainer.rng = restore_rng(meta["rng"])
    trainer.steps_done = meta["steps_done"]
    return meta


def fit(trainer, train_loader, test_loader, epochs, schedule=None, out_dir=None, model_name="model",
        resume=None, progress=True, log=print, on_step=None):
    """Train for ``epochs``; each epoch ends with a test accuracy, a metrics line and a checkpoint.

    Ctrl-C saves a checkpoint at the batch reached and re-raises. Returns the
    list of per-epoch metrics dicts.
    """
    start_epoch, skip = 0, 0
    if resume:
        meta = restore(resume, trainer, schedule, model_name)
        start_epoch, skip = meta["epoch"], meta["batch"]
        log(f"resumed from {resume}: epoch {start_epoch + 1}, batch {skip}")
    ckpt = os.path.join(out_dir, "checkpoint.safetensors") if out_dir else None
    metrics_path = os.path.join(out_dir, "metrics.jsonl") if out_dir else None
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    history = []
    for epoch in range(start_epoch, epochs):
        train_loader.set_epoch(epoch)
        t0, losses, batch = time.perf_counter(), [], 0
        bar = tqdm(total=len(train_loader), desc=f"epoch {epoch + 1}/{epochs}", disable=not progress,
                   leave=False, dynamic_ncols=True)
        try:
            for batch, (x, y) in enumerate(train_loader):
                if batch < skip:
                    bar.update(1)
                    continue
                loss = trainer.step(x, y)
                losses.append(loss)
                if on_step is not None:
                    on_step(epoch, batch, loss)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
        except KeyboardInterrupt:
            bar.close()
            if ckpt:
                save(ckpt, trainer, schedule, model_name, epoch, batch)
                log(f"interrupted: checkpoint saved to {ckpt} (epoch {epoch + 1}, batch {batch})")
            raise
        bar.close()
        skip = 0
        if schedule is not None:
            schedule.step()
        acc = evaluate(trainer, test_loader) if test_loader is not None else None
        m = {"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else None, "test_accuracy": acc,
             "seconds": round(time.perf_counter() - t0, 3), "lr": trainer.optimizer.lr,
             "peak_bytes": trainer.measured_peak_bytes}
        history.append(m)
        log(f"epoch {epoch + 1:>3}/{epochs}  loss {m['loss']:.4f}  "
            + (f"test acc {acc * 100:.2f}%  " if acc is not None else "") + f"({m['seconds']:.1f} s)")
        if metrics_path:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(m) + "\n")
        if ckpt:
            save(ckpt, trainer, schedule, model_name, epoch + 1, 0)
    return history
