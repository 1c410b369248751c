"""Training-step time of minidnn vs PyTorch on the CPU, measured in one run.

    python scripts/bench_cpu.py [--steps 7] [--batch-size 32] [--threads 2] [--measured]
                                [--without-implicit] [--without-winograd]

For ResNet-18 (CIFAR variant) and VGG-11 at 3x32x32, both frameworks train
the same network (minidnn's weights copied into PyTorch's) with SGD+momentum,
on the same thread count, their steps alternated; the median of ``--steps``
steps after two warm-up steps is reported for each, with the ratio
minidnn / PyTorch (< 1: faster). minidnn plans with its default cost model
(the CPU profile's speed hints choose each convolution's algorithm);
``--measured`` also times a trainer whose algorithms are chosen by timing each
one on this machine (``MemoryConfig(profile="measured")``, cached on disk), and
``--without-implicit`` (``--without-winograd``) one without the implicit (Winograd)
convolutions; all steps alternated.
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np

from minidnn import models, nn, optim
from minidnn.backend.cpu import CPUBackend


def torch_resnet18_cifar(tnn, num_classes=10):
    class Block(tnn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.relu = tnn.ReLU()
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = tnn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(64)
            self.relu = tnn.ReLU()
            self.maxpool = tnn.Identity()
            widths, cin = (64, 128, 256, 512), 64
            for i, w in enumerate(widths):
                stride = 1 if i == 0 else 2
                setattr(self, f"layer{i + 1}", tnn.Sequential(Block(cin, w, stride), Block(w, w, 1)))
                cin = w
            self.avgpool = tnn.AdaptiveAvgPool2d((1, 1))
            self.fc = tnn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            for i in range(4):
                x = getattr(self, f"layer{i + 1}")(x)
            return self.fc(self.avgpool(x).flatten(1))

    return Net()


def torch_vgg11(tnn, num_classes=10, image_size=32):
    layers, cin = [], 3
    for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
        if v == "M":
            layers.append(tnn.MaxPool2d(2, 2))
        else:
            layers += [tnn.Conv2d(cin, v, 3, padding=1), tnn.ReLU()]
            cin = v

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.features = tnn.Sequential(*layers)
            self.avgpool = tnn.Identity()
            side = image_size // 32
            self.classifier = tnn.Sequential(tnn.Linear(512 * side * side, 4096), tnn.ReLU(), tnn.Dropout(),
                                             tnn.Linear(4096, 4096), tnn.ReLU(), tnn.Dropout(),
                                             tnn.Linear(4096, num_classes))

        def forward(self, x):
            return self.classifier(self.avgpool(self.features(x)).flatten(1))

    return Net()


def median_steps(fns, steps, warmup=2):
    """Median step times of each of ``fns``, their steps alternated so that drift of a noisy
    machine weighs on all alike."""
    for _ in range(warmup):
        for f in fns:
            f()
    times = [[] for _ in fns]
    for _ in range(steps):
        for f, ts in zip(fns, times):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def bench(name, make_net, torch_net, batch, steps, torch, variants):
    """``variants``: (label, device, memory) of the minidnn trainers timed beside the default one."""
    shape = (batch, 3, 32, 32)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, batch)
    trainers = []
    for _, device, memory in [("", "cpu", None)] + variants:
        net = make_net().init_parameters(0)
        trainers.append(minidnn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                                        device=device, memory=memory))
    torch_net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    opt = torch.optim.SGD(torch_net.parameters(), lr=0.01, momentum=0.9)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(torch_net(tx), ty)
        loss.backward()
        opt.step()

    *t_mdn, t_torch = median_steps([lambda t=t: t.step(x, y) for t in trainers] + [torch_step], steps)
    line = (f"{name:<18} batch {batch:>3}  minidnn {t_mdn[0] * 1e3:8.1f} ms  PyTorch {t_torch * 1e3:8.1f} ms  "
            f"ratio {t_mdn[0] / t_torch:5.2f}")
    for (label, _, _), t in zip(variants, t_mdn[1:]):
        line += f"  | {label} {t * 1e3:8.1f} ms  ratio {t / t_torch:5.2f}"
    print(line, flush=True)
    return t_mdn[0] / t_torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--without-implicit", action="store_true",
                    help="also time minidnn without its implicit convolution algorithm, steps alternated")
    ap.add_argument("--without-winograd", action="store_true",
                    help="also time minidnn without its Winograd convolution algorithms, steps alternated")
    ap.add_argument("--measured", action="store_true",
                    help="also time minidnn with algorithms chosen by measuring them here, steps alternated")
    args = ap.parse_args()
    variants = ([("measured", "cpu", minidnn.MemoryConfig(profile="measured"))] if args.measured else []) + (
        [("without implicit", CPUBackend(implicit=False), None)] if args.without_implicit else []) + (
        [("without winograd", CPUBackend(winograd=False), None)] if args.without_winograd else [])
    import torch
    torch.set_num_threads(args.threads)
    print(f"minidnn {minidnn.__version__}, PyTorch {torch.__version__}, {args.threads} threads, "
          f"median of {args.steps} steps after 2 warm-up steps")
    bench("ResNet-18 (CIFAR)", lambda: models.get("resnet18_cifar", num_classes=10), torch_resnet18_cifar(torch.nn),
          args.batch_size, args.steps, torch, variants)
    bench("VGG-11", lambda: models.get("vgg11", num_classes=10, image_size=32), torch_vgg11(torch.nn),
          args.batch_size, args.steps, torch, variants)

if __name__ == "__main__":
    main()
