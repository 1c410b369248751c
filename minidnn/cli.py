"""The ``minidnn`` command: train, eval, models, plan, info.

Every failure a user can cause (a missing data file, a checkpoint of another
model, a budget below the minimum, ...) ends as one line
``minidnn: error: ...`` on stderr and exit status 2; Ctrl-C during training
saves a checkpoint and exits with 130.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import sys

import numpy as np

from .errors import CheckpointError, ConfigError, DistributedError, MemoryBudgetError, MinidnnError
from .memory.config import parse_budget
from .memory.policies import POLICIES

STEPS_HELP = ("The output folder gets checkpoint.safetensors (every epoch and on Ctrl-C), steps.jsonl (one line "
              "per step: epoch, batch, step, loss, lr) and metrics.jsonl (one line per epoch: loss, test "
              "accuracy, seconds, lr, peak bytes). A folder holding another run's files is refused unless --resume "
              "continues that run (from the folder's own checkpoint) or --overwrite replaces it; a folder a run is "
              "training into is locked. Ctrl-C finishes the running step, saves the checkpoint and exits "
              "with status 130 (a second Ctrl-C stops at once, keeping the previous checkpoint). --resume "
              "continues exactly: the resumed run rewrites the log lines after its checkpoint and repeats the "
              "losses, accuracies and final weights of an uninterrupted run.")


SUB_BATCHING = {"needed": True, "fastest": "fastest", "off": False}   # --sub-batching -> MemoryConfig


def _optimizer(args):
    from . import optim
    if args.optimizer == "sgd":
        return optim.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                         nesterov=args.nesterov)
    if args.optimizer == "adam":
        return optim.Adam(lr=args.lr, weight_decay=args.weight_decay)
    return optim.AdamW(lr=args.lr, weight_decay=args.weight_decay)


def _lr_schedule(args, opt):
    from . import optim
    if args.schedule == "cosine":
        return optim.CosineAnnealingLR(opt, T_max=args.epochs)
    if args.schedule == "step":
        return optim.StepLR(opt, step_size=max(1, args.epochs // 3))
    return None


def _normalization(train_set):
    """Per-channel mean and std of the training images (stored in checkpoints, so eval needs no training set)."""
    mean = train_set.images.mean(axis=(0, 2, 3)).tolist()
    std = (train_set.images.std(axis=(0, 2, 3)) + 1e-6).tolist()
    return mean, std


def _build(model, dataset):
    """The network for ``dataset``'s images and classes, its weights not yet drawn.

    Weights come later (``init_parameters`` or a checkpoint), after ``compile``
    has traced the network: a size it cannot take fails at once, and large
    networks do not draw their weights twice.
    """
    from .report import shapes_only
    from .training import build_model
    c, h, _ = dataset.shape
    with shapes_only():
        return build_model(model, num_classes=dataset.num_classes, in_channels=c, image_size=h)


# The settings of a run: a resumed run takes those not given on the command line from its checkpoint.
RUN_DEFAULTS = {"model": "lenet5", "data": "digits", "image_size": None, "batch_size": 32, "epochs": 30,
                "seed": 0, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": False,
                "weight_decay": 5e-4, "schedule": "cosine", "augment": "crop", "pad": 2, "precision": "fp32"}


def _fits(value, default):
    """Whether a checkpoint's ``value`` is of the kind of the setting whose default is ``default``."""
    if default is None:                                   # --image-size: a size, or none
        return value is None or type(value) is int
    if isinstance(default, float):
        return type(value) in (int, float)
    return type(value) is type(default)                   # str, int, bool: a bool is not a count


def _run_settings(args, resume):
    """Fill ``args``' unset run settings from the checkpoint's (older ones: its optimizer's), else the defaults.

    The hyperparameters given on the command line then replace the checkpoint's optimizer state's (which
    ``restore`` loads). Returns the names of the settings given.
    """
    given = {k for k in RUN_DEFAULTS if getattr(args, k) is not None}
    saved = {}
    if resume is not None:
        saved = {k: v for k, v in resume.meta["optimizer"].items() if k in ("momentum", "weight_decay", "nesterov")}
        saved.update({"model": resume.meta["model"], **resume.meta.get("config", {})})
    for k, default in RUN_DEFAULTS.items():
        if k not in given:
            value = saved.get(k, default)
            if not _fits(value, default):
                raise CheckpointError(f"{resume.path}: its setting {k} is {value!r}, which does not fit --{k}")
            setattr(args, k, value)
    if resume is not None:
        hyper = {k: getattr(args, k) for k in ("lr", "momentum", "weight_decay", "nesterov") if k in given}
        hyper.update({"initial_lr": args.lr} if "lr" in given else {})
        resume.meta["optimizer"].update({k: v for k, v in hyper.items() if k in resume.meta["optimizer"]})
    return given


def _require(module, package, purpose):
    """ConfigError naming what to install where ``module`` (a dependency) cannot be imported: said at the
    start, not as a traceback when it is first used (``--trace-dir`` at its step)."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{purpose} needs {package}, a dependency of minidnn that is missing ({e}): "
                          f"pip install {package}") from None


def _check_train(args):
    """Refuse, in one line, settings that would fail later or be ignored (a NaN lr fails only at step 2)."""
    for name, low in (("image_size", 1), ("pad", 0), ("trace_step", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    if args.reset_optimizer and not args.resume:
        raise ConfigError("--reset-optimizer applies to --resume only")
    if args.trace_dir:
        _require("matplotlib", "matplotlib", "--trace-dir (its memory.png)")
    _optimizer(args)                          # its ranges (lr, momentum, weight decay), before any data is read


def cmd_train(args):
    """``minidnn train``: train, log, checkpoint every epoch and on Ctrl-C, resume exactly.

    Under ``mpiexec -n N`` (N > 1) each process is one data-parallel rank; rank 0 alone
    prints, logs and checkpoints."""
    from .distributed import launched
    parallel = launched(bn=args.parallel_bn)
    if parallel is not None and parallel.rank:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            return _train(args, parallel)
    return _train(args, parallel)


def _train(args, parallel):
    from . import models
    from .run_folder import RunFolder
    from .training import read_checkpoint
    if args.model is not None:
        models.info(args.model)                      # an unknown name fails before any data is read
    resume = read_checkpoint(args.resume, args.model) if args.resume else None
    given = _run_settings(args, resume)
    _check_train(args)
    if args.out is None:                             # a resumed run continues in its checkpoint's folder
        args.out = (os.path.dirname(args.resume) or ".") if args.resume else "runs/latest"
    if parallel is not None and parallel.rank:       # rank 0 alone logs and checkpoints
        return _run(args, parallel, resume, given, None)
    with RunFolder(args.out, args.metrics) as folder:
        try:
            folder.claim(args.resume, args.overwrite)
        except ConfigError as e:
            if parallel is None:
                raise
            raise DistributedError(f"rank 0: {e}") from None   # every rank stops: none waits for rank 0
        print(f"run folder: {os.path.abspath(args.out)}")
        return _run(args, parallel, resume, given, folder)


# `train` options that do not change what is trained (rank 0 alone writes the run's files): data-parallel
# ranks may differ in these, and must agree on every other. --data and --resume are paths, which may differ
# between machines: the data's fingerprint and the checkpoint's position are compared instead.
PER_RANK_OPTIONS = ("command", "fn", "out", "overwrite", "metrics", "no_progress", "trace_dir", "trace_step",
                    "data", "resume")


def _rank_settings(args, resume, train_set, test_set):
    """What every data-parallel rank must have alike: each option that changes the training, and the data."""
    from .data import fingerprint
    settings = {f"--{k.replace('_', '-')}": v for k, v in vars(args).items() if k not in PER_RANK_OPTIONS}
    settings["--resume checkpoint"] = (f"epoch {resume.meta['epoch']}, batch {resume.meta['batch']}"
                                       if resume is not None else "none")
    settings["training data"] = fingerprint(train_set)
    settings["test data"] = fingerprint(test_set)
    return settings


def _run(args, parallel, resume, given, folder):
    """Train in ``folder`` (a claimed :class:`RunFolder`; None on the ranks that do not write)."""
    from . import MemoryConfig, compile, nn
    from .data import DataLoader, load
    from .training import fit
    train_set = load(args.data, "train", size=args.image_size)
    test_set = load(args.data, "test", size=args.image_size)
    if parallel is not None:       # refused before anything is built: every rank must train the same thing
        parallel.require_same(_rank_settings(args, resume, train_set, test_set))
    net = _build(args.model, train_set)
    opt = _optimizer(args)
    sched = _lr_schedule(args, opt)
    train_loader = DataLoader(train_set, args.batch_size, shuffle=True, drop_last=False, seed=args.seed,
                              augment=False if args.augment == "none" else args.augment,
                              pad=args.pad, shard=parallel.shard_of if parallel is not None else None)
    test_loader = DataLoader(test_set, args.batch_size, shuffle=False)
    if args.trace_dir:
        start = (resume.meta["epoch"] * len(train_loader) + resume.meta["batch"]) if resume is not None else 0
        steps = args.epochs * len(train_loader) - start
        if args.trace_step > steps:
            raise ConfigError(f"--trace-step {args.trace_step} lies past the last step of this run ({steps} steps: "
                              f"{args.epochs} epochs of {len(train_loader)} batches"
                              + (f", {start} done by the checkpoint)" if start else ")"))
    device = parallel.device(args.device) if parallel is not None else args.device   # a rank: its GPU
    trainer = compile(net, (args.batch_size, *train_set.shape), nn.CrossEntropyLoss(), opt,
                      device=device, memory=MemoryConfig(budget=parse_budget(args.budget), bn=args.bn,
                                                          sub_batching=SUB_BATCHING[args.sub_batching]),
                      seed=args.seed, parallel=parallel, normalize=_normalization(train_set),   # kept in checkpoints
                      precision=args.precision)
    net.init_parameters(args.seed)        # in place, into the trainer's persistent region
    print(f"{args.model}: {net.num_parameters():,} parameters; {len(train_set)} training and "
          f"{len(test_set)} test images of {train_set.shape} from {train_set.name}")
    print(trainer.plan.summary(top=0))
    if parallel is not None:
        bn = ("BatchNorm statistics over the global mini-batch" if parallel.bn == "sync" else
              "BatchNorm statistics per rank (--parallel-bn local: not one process's)")
        print(f"data-parallel over {parallel.size} ranks ({parallel.describe_members()}); --batch-size "
              f"{args.batch_size} is the global mini-batch; {bn}")
    config = {k: getattr(args, k) for k in RUN_DEFAULTS if k != "model"}
    config["image_size"] = train_set.shape[1]
    if resume is not None:
        old = resume.meta.get("config", {})
        changed = [k for k in sorted(given) if k in old and old[k] != config.get(k)]
        if changed:
            print(f"warning: {', '.join(f'{k} {old[k]!r} -> {config[k]!r}' for k in changed)} since the "
                  "checkpoint; the resumed run will not repeat the original", file=sys.stderr)
    run_info = {"config": config}
    on_step = None
    lead = folder is not None                            # the rank that logs and checkpoints
    if args.trace_dir and parallel is not None:          # each rank its own trace
        args.trace_dir = os.path.join(args.trace_dir, f"rank{parallel.rank}")
    if args.trace_dir:
        trainer.recorder.every = 1
        seen = []

        def on_step(epoch, batch, loss):   # the recorder holds the step just run
            seen.append(loss)
            if len(seen) == args.trace_step:
                try:
                    paths = trainer.save_trace(args.trace_dir)
                except OSError as e:       # a full disk: the trace is lost, not the training
                    print(f"warning: the memory trace of step {args.trace_step} was not written to "
                          f"{args.trace_dir} ({' '.join(str(e).split())}); training goes on", file=sys.stderr)
                else:
                    print(f"memory trace of step {args.trace_step}: {', '.join(paths)}")
    if folder is not None and args.overwrite:
        folder.clear()                     # only now: a run refused by any check above loses nothing
    try:
        hist = fit(trainer, train_loader, test_loader, args.epochs, sched, out_dir=folder if lead else None,
                   model_name=args.model, resume=resume, progress=not args.no_progress and lead,
                   metrics_path=args.metrics if lead else None, run_info=run_info, on_step=on_step,
                   reset_optimizer=args.reset_optimizer, precision_change="precision" in given)
    except KeyboardInterrupt:
        ckpt = os.path.join(args.out, "checkpoint.safetensors")
        hint = f"; continue with --resume {ckpt}" if os.path.isfile(ckpt) else ""
        print(f"minidnn: interrupted{hint}", file=sys.stderr)
        return 130
    if hist and hist[-1]["test_accuracy"] is not None:
        print(f"final test accuracy {hist[-1]['test_accuracy'] * 100:.2f}%")
    elif not hist and resume is not None:
        print(f"nothing to do: the checkpoint has finished epoch {resume.meta['epoch']} of --epochs {args.epochs}")
    if folder is not None:
        written = ", ".join(os.path.basename(f) for f in folder.previous())
        print(f"run folder: {os.path.abspath(args.out)} ({written})")
    return 0


def cmd_trace(args):
    """``minidnn trace``: summary, plot, diff and export of saved traces."""
    from .trace import diff, load, plot, summary, to_csv
    if args.trace_command == "summary":
        print(summary(load(args.file)))
    elif args.trace_command == "plot":
        _require("matplotlib", "matplotlib", "trace plot")
        plot(load(args.file), args.output)
        print(f"wrote {args.output}")
    elif args.trace_command == "diff":
        print(diff(load(args.a), load(args.b), names=(args.a, args.b)))
    else:
        t = load(args.file)
        if not (args.snapshot or args.csv):
            raise MinidnnError("trace export: give --snapshot PICKLE and/or --csv FILE")
        if args.snapshot:
            t.save_memory_snapshot(args.snapshot)
        if args.csv:
            to_csv(t, args.csv)
    return 0


def cmd_eval(args):
    """``minidnn eval``: test accuracy of a checkpoint (model, data and normalisation from the checkpoint)."""
    from . import compile, models, nn
    from .data import DataLoader, load
    from .training import evaluate, read_checkpoint, restore
    if args.model:
        models.info(args.model)
    ckpt = read_checkpoint(args.checkpoint, args.model)
    model, config = ckpt.meta["model"], ckpt.meta.get("config", {})
    data = args.data or config.get("data", "digits")
    size = args.image_size or config.get("image_size")
    test_set = load(data, "test", size=size)
    net = _build(model, test_set)
    # the checkpoint's normalization (restore sets it; None: none); a first-format one may not say
    norm = None if "normalization" in ckpt.meta else _normalization(load(data, "train", size=size))
    trainer = compile(net, (args.batch_size, *test_set.shape), nn.CrossEntropyLoss(), device=args.device,
                      normalize=norm)
    restore(ckpt, trainer)
    acc = evaluate(trainer, DataLoader(test_set, args.batch_size, shuffle=False))
    print(f"{model}: test accuracy {acc * 100:.2f}% on {len(test_set)} images of {test_set.name}")
    return 0


def cmd_models(args):
    """``minidnn models``: parameters, FLOPs and memory of every reference model; no kernels run."""
    from . import models
    from .report import model_row, models_table
    names = [n for n in models.names() if args.all or n != "resnet_deep"]
    rows = [model_row(n, args.batch_size, args.image_size, args.precision) for n in names]
    print(json.dumps(rows, indent=1) if args.json else models_table(rows, args.batch_size, args.image_size))
    return 0


def cmd_plan(args):
    """``minidnn plan``: the memory plan of one training step under a budget; no kernels run. With
    ``--ranks N``, each of N data-parallel ranks plans its share of the batch and the step time and
    scaling efficiency of N ranks on the profile's interconnect are predicted."""
    from . import models
    from .memory.profiles import SYSTEMS, get_system
    from .report import make_plan, plan_dict, plan_text, ranks_dict, ranks_text
    models.info(args.model)
    system = get_system(args.profile).at_precision(args.precision)
    if args.ranks < 1 or args.batch_size % args.ranks:
        raise MinidnnError(f"--batch-size {args.batch_size} (the global mini-batch) must split evenly over "
                           f"--ranks {args.ranks}")
    if args.ranks > 1 and system.intra is None:
        raise MinidnnError(f"--profile {args.profile} is one device; --ranks {args.ranks} needs a system "
                           f"profile ({', '.join(sorted(SYSTEMS))})")
    system.link(args.ranks)               # more ranks than the system has devices fails before planning
    try:
        plan, shape = make_plan(args.model, args.batch_size // args.ranks, args.image_size,
                                parse_budget(args.budget), args.policy, system.device,
                                SUB_BATCHING[args.sub_batching], args.bn, args.precision)
    except MemoryBudgetError as e:
        if args.json:   # machines get the minimum too; the one-line error still goes to stderr
            print(json.dumps({"model": args.model, "error": str(e), "minimum_bytes": e.minimum_bytes}))
        raise
    pred = None
    if args.ranks > 1 or system.intra is not None:
        from .memory.dataparallel import predict
        from .distributed.buckets import gradient_buckets
        pred = predict(plan, [b.grads for b in gradient_buckets(plan.schedule)], system, args.ranks)
    if args.json:
        out = plan_dict(plan, args.model, shape, system.device, args.policy)
        out["precision"] = args.precision
        if pred is not None:
            out["data_parallel"] = ranks_dict(pred, system)
        print(json.dumps(out, indent=1))
    else:
        if args.precision != "fp32":
            print(f"precision {args.precision}: convolutions and GEMMs on the profile's {args.precision.upper()} "
                  "tensor cores (at FP32 where it has none)" +
                  ("; activations stored in it, fp32 master weights" if args.precision in ("bf16", "fp16") else ""))
        print(plan_text(plan, args.model, shape, system.device, args.policy))
        if pred is not None:
            print(ranks_text(pred, system, args.batch_size))
    return 0


def cmd_info(args):
    """``minidnn info``: versions, the CPU extension, CUDA and cuDNN availability."""
    from . import __file__ as package_file, __version__
    print(f"minidnn {__version__} ({os.path.dirname(package_file)})")
    print(f"python {platform.python_version()} ({platform.platform()}); numpy {np.__version__}")
    try:
        from . import _C
        threads = _C.get_num_threads() if hasattr(_C, "get_num_threads") else "?"
        openmp = getattr(_C, "has_openmp", False)
        openmp = "OpenMP" if (openmp() if callable(openmp) else openmp) else "no OpenMP"
        implicit = "implicit convolutions (AVX-512F)" if _C.conv2d_implicit_available() else \
            "no implicit convolutions (the CPU lacks AVX-512F)"
        print(f"cpu backend: available; extension {_C.__file__} ({openmp}, {threads} threads, {implicit})")
    except ImportError as e:
        print(f"cpu backend: extension missing ({e})")
    from .backend.cuda import status       # imports CuPy and the cuDNN binding if present; no GPU needed
    for line in status().lines():
        print(line)
    try:   # the installed version, without the seconds importing torch takes
        print(f"torch {importlib.metadata.version('torch')} (optional: tests compare against it)")
    except importlib.metadata.PackageNotFoundError:
        print("torch: not installed (optional: tests compare against it)")
    return 0


def parser():
    """The argument parser of the ``minidnn`` command."""
    from .memory import PROFILES
    from .memory.profiles import PRECISIONS, SYSTEMS
    p = argparse.ArgumentParser(prog="minidnn", description="Train CNNs within a memory budget.",
                                epilog="Errors are one line on stderr (exit status 2); set MINIDNN_DEBUG=1 "
                                       "for the traceback.")
    sub = p.add_subparsers(dest="command")
    t = sub.add_parser("train", help="train a model (default: LeNet-5 on the bundled digits)", epilog=STEPS_HELP)
    t.add_argument("--model", default=None, help="a name from `minidnn models` (default: lenet5)")
    t.add_argument("--data", default=None, help="digits | mnist:DIR | fashion-mnist:DIR | cifar10:DIR | "
                   "cifar100:DIR | imagefolder:DIR | synthetic:CxHxW[:classes=K][:n=N] (default: digits)")
    t.add_argument("--epochs", type=int, default=None, help="default: 30")
    t.add_argument("--batch-size", type=int, default=None, help="the global mini-batch: under mpiexec -n N each rank trains on its 1/N "
                   "slice of it, so N does not change what is trained (default: 32)")
    t.add_argument("--image-size", type=int, default=None, help="resize images to this size (bilinear)")
    t.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default=None, help="default: sgd")
    t.add_argument("--lr", type=float, default=None, help="initial learning rate (default: 0.05)")
    t.add_argument("--momentum", type=float, default=None, help="SGD momentum in [0, 1] (default: 0.9)")
    t.add_argument("--nesterov", action="store_true", default=None)
    t.add_argument("--weight-decay", type=float, default=None, help="L2 weight decay >= 0 (default: 5e-4)")
    t.add_argument("--schedule", choices=["none", "step", "cosine"], default=None,
                   help="learning-rate schedule (default: cosine)")
    t.add_argument("--augment", choices=["none", "crop", "crop+flip"], default=None,
                   help="random crop after zero padding (and horizontal flip: the CIFAR recipe; default: crop)")
    t.add_argument("--pad", type=int, default=None, help="zero padding before the random crop (default: 2)")
    t.add_argument("--budget", default=None, help="memory budget: bytes, '512MiB', or a fraction like 0.6")
    t.add_argument("--bn", choices=["exact", "sub-batch"], default="exact",
                   help="when the budget splits a batch into sub-batches, BatchNorm uses the full batch's "
                        "statistics, as unsplit (exact), or each sub-batch's, as moDNN does (sub-batch)")
    t.add_argument("--sub-batching", choices=list(SUB_BATCHING), default="fastest",
                   help="split a batch into sub-batches whose gradients add up: when it cannot fit and "
                        "when that is predicted faster than evicting and keeps the step's meaning (fastest, "
                        "the default), only when it cannot fit (needed), or never (off)")
    t.add_argument("--device", default="cpu", help="cpu | cuda")
    t.add_argument("--precision", choices=list(PRECISIONS), default=None,
                   help="fp32 (default), tf32, or mixed precision as torch.autocast: bf16, or fp16 with dynamic "
                        "loss scaling; with --resume, the checkpoint's unless given (given: a change on purpose)")
    t.add_argument("--parallel-bn", choices=["sync", "local"], default="sync",
                   help="under mpiexec: BatchNorm statistics over the global mini-batch (sync, the meaning "
                        "of one process) or each rank's slice (local, as PyTorch DDP by default)")
    t.add_argument("--out", default=None, help="folder for the checkpoint and logs, refused if it holds another "
                   "run (see below; default: runs/latest, or with --resume the checkpoint's folder)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out (its checkpoint and logs), once every other check has passed")
    t.add_argument("--metrics", default=None, help="per-epoch metrics JSONL file (default OUT/metrics.jsonl)")
    t.add_argument("--resume", default=None, metavar="CHECKPOINT",
                   help="continue exactly where this checkpoint stopped: the model, data, batch size, seed, "
                        "epochs, optimizer and schedule not given on the command line are the checkpoint's")
    t.add_argument("--reset-optimizer", action="store_true",
                   help="with --resume: accept a checkpoint without (complete) optimizer state and restart "
                        "the optimizer's state (momentum, Adam's moments) from zero")
    t.add_argument("--seed", type=int, default=None,
                   help="seeds initialisation, shuffling, augmentation, dropout (default: 0)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--trace-dir", default=None, metavar="DIR",
                   help="write the memory timeline of one training step (--trace-step) to DIR: trace.json "
                        "(Perfetto), memory.png, memory_snapshot.pickle (pytorch.org/memory_viz), memory.csv")
    t.add_argument("--trace-step", type=int, default=3,
                   help="which training step of this run --trace-dir records (default: 3)")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="test accuracy of a checkpoint")
    e.add_argument("checkpoint")
    e.add_argument("--model", default=None, help="check the checkpoint is for this model (default: its own)")
    e.add_argument("--data", default=None, help="data set spec (default: the one it was trained on)")
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--image-size", type=int, default=None)
    e.add_argument("--device", default="cpu")
    e.set_defaults(fn=cmd_eval)

    m = sub.add_parser("models", help="parameters, FLOPs and memory of every reference model (no kernels run)")
    m.add_argument("--batch-size", type=int, default=1)
    m.add_argument("--image-size", type=int, default=None, help="default: each model's own input size")
    m.add_argument("--all", action="store_true", help="include resnet_deep (1001 layers)")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    m.add_argument("--precision", choices=list(PRECISIONS), default="fp32",
                   help="the memory of a step in this precision (bf16/fp16: mixed precision, 2-byte activations)")
    m.set_defaults(fn=cmd_models)

    pl = sub.add_parser("plan", help="the memory plan of a training step under a budget (no kernels run)")
    pl.add_argument("--model", required=True)
    pl.add_argument("--batch-size", type=int, default=32,
                    help="the global mini-batch: with --ranks N, each rank plans batch-size / N")
    pl.add_argument("--image-size", type=int, default=None, help="default: the model's own input size")
    pl.add_argument("--budget", default=None,
                    help="bytes, '12GiB', '60%%' or a fraction of the liveness peak (per device)")
    pl.add_argument("--profile", choices=sorted(PROFILES) + sorted(SYSTEMS), default="titanx-12gb",
                    help="device profile for the cost model, or a multi-device system (" +
                         ", ".join(sorted(SYSTEMS)) + ") whose device it uses")
    pl.add_argument("--precision", choices=list(PRECISIONS), default="fp32",
                    help="fp32 (CUDA cores), tf32 (tensor cores on FP32 data, A100 on), or bf16/fp16: mixed "
                         "precision as torch.autocast (2-byte activations, fp32 master weights)")
    pl.add_argument("--ranks", type=int, default=1,
                    help="data-parallel ranks (devices of a system profile): predicts the step time and "
                         "the scaling efficiency (each rank at batch-size / N, against one device at that "
                         "batch) without running a kernel")
    pl.add_argument("--policy", choices=list(POLICIES), default="auto",
                    help="auto (the planner's search), none, swap, recompute, or a paper's policy")
    pl.add_argument("--sub-batching", choices=list(SUB_BATCHING), default="fastest",
                    help="plan the split `minidnn train` would make (as its --sub-batching)")
    pl.add_argument("--bn", choices=["exact", "sub-batch"], default="exact", help="as `minidnn train --bn`")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(fn=cmd_plan)

    i = sub.add_parser("info", help="backends, extension and versions")
    i.set_defaults(fn=cmd_info)

    tr = sub.add_parser("trace", help="read memory timeline traces (minidnn train --trace-dir)")
    tsub = tr.add_subparsers(dest="trace_command", required=True)
    ts = tsub.add_parser("summary", help="peak, bytes by category, largest tensors, copies, stalls, plan vs run")
    ts.add_argument("file")
    tp = tsub.add_parser("plot", help="memory by category over the step, budget, plan, stream lanes (PNG)")
    tp.add_argument("file")
    tp.add_argument("-o", "--output", default="memory.png")
    td = tsub.add_parser("diff", help="compare two traces (two runs, or a plan and a run)")
    td.add_argument("a")
    td.add_argument("b")
    te = tsub.add_parser("export", help="PyTorch memory snapshot (pickle) and/or CSV of the memory curve")
    te.add_argument("file")
    te.add_argument("--snapshot", default=None, metavar="PICKLE")
    te.add_argument("--csv", default=None)
    tr.set_defaults(fn=cmd_trace)
    return p


def main(argv=None):
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    p = parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 2
    for name in ("batch_size", "epochs"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        return args.fn(args)
    except KeyboardInterrupt:            # outside training (which saves first): nothing to save
        print("minidnn: interrupted", file=sys.stderr)
        return 130
    except (MinidnnError, ValueError, OSError) as e:
        if os.environ.get("MINIDNN_DEBUG"):
            raise
        # One line, whatever the cause: its message may span lines (a shape error listing inputs).
        print(f"minidnn: error: {' '.join(str(e).split())}", file=sys.stderr)
        if isinstance(e, DistributedError):        # a rank failed: stop every rank, none waits on it
            from .distributed.launch import abort
            abort(2)
        return 2


if __name__ == "__main__":
    sys.exit(main())
