"""The ``minidnn`` command: train, eval, models, info."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np

from .errors import MinidnnError


def _optimizer(args):
    from . import optim
    if args.optimizer == "sgd":
        return optim.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                         nesterov=args.nesterov)
    if args.optimizer == "adam":
        return optim.Adam(lr=args.lr, weight_decay=args.weight_decay)
    return optim.AdamW(lr=args.lr, weight_decay=args.weight_decay)


def _schedule(args, opt):
    from . import optim
    if args.schedule == "cosine":
        return optim.CosineAnnealingLR(opt, T_max=args.epochs)
    if args.schedule == "step":
        return optim.StepLR(opt, step_size=max(1, args.epochs // 3))
    return None


def _build(args, dataset):
    from . import models
    c, h, w = dataset.shape
    if args.image_size and args.image_size != h:
        raise MinidnnError(f"data set images are {h}x{w}, not {args.image_size}")
    return models.get(args.model, num_classes=dataset.num_classes, in_channels=c, image_size=h)


def cmd_train(args):
    from . import MemoryConfig, compile, nn
    from .data import DataLoader, load
    from .training import fit
    train_set = load(args.data, "train", size=args.image_size)
    test_set = load(args.data, "test", size=args.image_size)
    net = _build(args, train_set)
    net.init_parameters(args.seed)
    opt = _optimizer(args)
    sched = _schedule(args, opt)
    mean = train_set.images.mean(axis=(0, 2, 3)).tolist()
    std = (train_set.images.std(axis=(0, 2, 3)) + 1e-6).tolist()
    train_loader = DataLoader(train_set, args.batch_size, shuffle=True, drop_last=False, seed=args.seed,
                              mean=mean, std=std, augment=False if args.augment == "none" else args.augment,
                              pad=args.pad)
    test_loader = DataLoader(test_set, args.batch_size, shuffle=False, mean=mean, std=std)
    memory = MemoryConfig(budget=args.budget)
    trainer = compile(net, (args.batch_size, *train_set.shape), nn.CrossEntropyLoss(), opt,
                      device=args.device, memory=memory, seed=args.seed)
    print(f"{args.model}: {net.num_parameters():,} parameters; {len(train_set)} training and "
          f"{len(test_set)} test images of {train_set.shape} from {train_set.name}")
    print(trainer.plan.summary(top=0).split("\n  largest")[0])
    try:
        hist = fit(trainer, train_loader, test_loader, args.epochs, sched, out_dir=args.out,
                   model_name=args.model, resume=args.resume, progress=not args.no_progress)
    except KeyboardInterrupt:
        return 130
    if hist and hist[-1]["test_accuracy"] is not None:
        print(f"final test accuracy {hist[-1]['test_accuracy'] * 100:.2f}%")
    return 0


def cmd_eval(args):
    from . import compile, nn, optim
    from .data import DataLoader, load
    from .training import evaluate, restore
    test_set = load(args.data, "test", size=args.image_size)
    net = _build(args, test_set)
    trainer = compile(net, (args.batch_size, *test_set.shape), nn.CrossEntropyLoss(), optim.SGD(lr=0.0),
                      device=args.device)
    restore(args.checkpoint, trainer, None, args.model)
    train_set = load(args.data, "train", size=args.image_size)
    mean = train_set.images.mean(axis=(0, 2, 3)).tolist()
    std = (train_set.images.std(axis=(0, 2, 3)) + 1e-6).tolist()
    acc = evaluate(trainer, DataLoader(test_set, args.batch_size, shuffle=False, mean=mean, std=std))
    print(f"test accuracy {acc * 100:.2f}% on {len(test_set)} images")
    return 0


def cmd_models(args):
    from . import models
    from .autograd import build_schedule
    from .graph import trace
    from .memory import format_bytes, plan_memory
    from .nn import CrossEntropyLoss
    from .optim import SGD
    rows = []
    for name in models.names():
        c, _, _ = models.default_input(name)
        size = args.image_size or models.default_input(name)[1]
        try:
            net = models.get(name, image_size=size)
            g = trace(net, (args.batch_size, c, size, size), loss=CrossEntropyLoss())
        except MinidnnError as e:
            rows.append((name, "-", "-", "-", "-", f"({str(e).splitlines()[0][:60]})"))
            continue
        plan = plan_memory(build_schedule(g, optimizer=SGD(lr=0.1, momentum=0.9)))
        flops = sum(n.op.flops([v.spec for v in n.inputs], [o.spec for o in n.outputs]) for n in g.nodes)
        rows.append((name, f"{net.num_parameters() / 1e6:.2f}M", f"{flops / args.batch_size / 1e9:.2f}",
                     format_bytes(plan.ideal_bytes), format_bytes(plan.liveness_peak_bytes), ""))
    print(f"batch {args.batch_size}, image size {args.image_size or 'default'}; GFLOPs are forward, per image")
    print(f"{'model':<16}{'params':>10}{'GFLOPs':>10}{'ideal':>14}{'liveness peak':>16}")
    for r in rows:
        print(f"{r[0]:<16}{r[1]:>10}{r[2]:>10}{r[3]:>14}{r[4]:>16}  {r[5]}".rstrip())
    return 0


def cmd_info(args):
    from . import __version__
    print(f"minidnn {__version__}  python {platform.python_version()}  numpy {np.__version__}")
    try:
        from . import _C
        print(f"cpu backend: available (extension {_C.__file__})")
    except ImportError as e:
        print(f"cpu backend: extension missing ({e})")
    try:
        from .backend import get_backend
        get_backend("cuda")
        print("cuda backend: available")
    except MinidnnError as e:
        print(f"cuda backend: unavailable ({e})")
    return 0


def parser():
    p = argparse.ArgumentParser(prog="minidnn", description="Train CNNs within a memory budget.")
    sub = p.add_subparsers(dest="command")
    t = sub.add_parser("train", help="train a model (default: LeNet-5 on the bundled digits)")
    t.add_argument("--model", default="lenet5")
    t.add_argument("--data", default="digits", help="digits | mnist:DIR | fashion-mnist:DIR | cifar10:DIR | "
                   "cifar100:DIR | imagefolder:DIR | synthetic:3x32x32")
    t.add_argument("--epochs", type=int, default=30)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--image-size", type=int, default=None)
    t.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    t.add_argument("--lr", type=float, default=0.05)
    t.add_argument("--momentum", type=float, default=0.9)
    t.add_argument("--nesterov", action="store_true")
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--schedule", choices=["none", "step", "cosine"], default="cosine")
    t.add_argument("--augment", choices=["none", "crop", "crop+flip"], default="crop",
                   help="random crop after zero padding (and horizontal flip: the CIFAR recipe)")
    t.add_argument("--pad", type=int, default=2, help="zero padding before the random crop")
    t.add_argument("--budget", default=None, help="memory budget: bytes, '512MiB', or a fraction like 0.6")
    t.add_argument("--device", default="cpu")
    t.add_argument("--out", default="runs/latest", help="checkpoint and metrics directory")
    t.add_argument("--resume", default=None, help="checkpoint to resume from")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="test accuracy of a checkpoint")
    e.add_argument("checkpoint")
    e.add_argument("--model", default="lenet5")
    e.add_argument("--data", default="digits")
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--image-size", type=int, default=None)
    e.add_argument("--device", default="cpu")
    e.set_defaults(fn=cmd_eval)

    m = sub.add_parser("models", help="parameters, FLOPs and memory of every reference model (no kernels run)")
    m.add_argument("--batch-size", type=int, default=1)
    m.add_argument("--image-size", type=int, default=None)
    m.set_defaults(fn=cmd_models)

    i = sub.add_parser("info", help="backends, extension and versions")
    i.set_defaults(fn=cmd_info)
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 2
    try:
        return args.fn(args)
    except (MinidnnError, FileNotFoundError) as e:
        print(f"minidnn: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"minidnn: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
