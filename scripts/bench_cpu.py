"""Training-step time of minidnn vs PyTorch on the CPU, measured in one run.

    python scripts/bench_cpu.py [--steps 7] [--batch-size 32] [--threads 2]

For ResNet-18 (CIFAR variant) and VGG-11 at 3x32x32, both frameworks train
the same network (minidnn's weights copied into PyTorch's) with SGD+momentum,
on the same thread count, their steps alternated; the median of ``--steps``
steps after two warm-up steps is reported for each, with the ratio
minidnn / PyTorch (< 1: faster).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import minidnn
from minidnn import models, nn, optim


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


def median_steps(a, b, steps, warmup=2):
    """Median step times of ``a`` and ``b``, their steps alternated so that drift of a noisy
    machine weighs on both alike."""
    for _ in range(warmup):
        a()
        b()
    times = {a: [], b: []}
    for _ in range(steps):
        for f in (a, b):
            t = time.perf_counter()
            f()
            times[f].append(time.perf_counter() - t)
    return statistics.median(times[a]), statistics.median(times[b])


def bench(name, mdn_net, torch_net, batch, steps, torch):
    shape = (batch, 3, 32, 32)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, batch)
    mdn_net.init_parameters(0)
    torch_net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in mdn_net.state_dict().items()})
    trainer = minidnn.compile(mdn_net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9))
    opt = torch.optim.SGD(torch_net.parameters(), lr=0.01, momentum=0.9)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(torch_net(tx), ty)
        loss.backward()
        opt.step()

    t_mdn, t_torch = median_steps(lambda: trainer.step(x, y), torch_step, steps)
    print(f"{name:<18} batch {batch:>3}  minidnn {t_mdn * 1e3:8.1f} ms  PyTorch {t_torch * 1e3:8.1f} ms  "
          f"ratio {t_mdn / t_torch:5.2f}", flush=True)
    return t_mdn / t_torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    print(f"minidnn {minidnn.__version__}, PyTorch {torch.__version__}, {args.threads} threads, "
          f"median of {args.steps} steps after 2 warm-up steps")
    bench("ResNet-18 (CIFAR)", models.get("resnet18_cifar", num_classes=10), torch_resnet18_cifar(torch.nn),
          args.batch_size, args.steps, torch)
    bench("VGG-11", models.get("vgg11", num_classes=10, image_size=32), torch_vgg11(torch.nn),
          args.batch_size, args.steps, torch)


if __name__ == "__main__":
    main()
