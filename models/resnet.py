"""Residual networks (He et al., 2015): torchvision's ImageNet ResNets and the CIFAR ones.

Every model here is one :class:`ResNet`: a stem, stages ``layer1``, ``layer2``
... of residual blocks, global average pooling and a Linear layer ``fc``.
Module and parameter names equal torchvision's (``conv1``, ``bn1``, ``relu``,
``maxpool``, ``layer1.0.conv1``, ``layer1.0.downsample.0`` ..., ``avgpool``,
``fc``), so torchvision state_dicts load as they are.

* ``resnet18/34/50/101/152``: torchvision's ImageNet models (3x224x224).
* ``resnet18_cifar``: ResNet-18 with a 3x3 stride-1 stem and no max pool, the
  usual CIFAR-10 variant. Its keys are resnet18's; only ``conv1.weight``
  (64x3x3x3 instead of 64x3x7x7) and ``fc`` (num_classes rows) differ in shape.
* ``resnet20/32/44/56/110`` and ``resnet_cifar(depth)``: the CIFAR networks of
  the paper's section 4.2: a 3x3 stem of 16 channels, three stages of ``n``
  BasicBlocks with 16/32/64 channels, depth = 6n + 2. Shortcuts are option B:
  identity, or a 1x1 convolution + BatchNorm where the shape changes (the paper
  used zero-padding identities, option A, which has no parameters; with
  option B ResNet-20 has 272,474 parameters instead of 0.27M).
* ``resnet_deep(depth)``: an ImageNet-style Bottleneck ResNet of any depth
  3 * blocks + 2 (see :func:`deep_layers` for how blocks are spread over the
  four stages).
"""
from __future__ import annotations

import numpy as np

from minidnn import nn

from . import _init


def conv3x3(in_planes, out_planes, stride=1):
    """3x3 convolution with padding, no bias (a BatchNorm follows)."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    """1x1 convolution, no bias."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (ResNet-18/34 and the CIFAR ResNets)."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, "ResNet v1.5" as torchvision), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A ResNet: stem, ``len(layers)`` stages of ``block``, global average pooling, ``fc``.

    ``widths`` are the stages' block widths (64/128/256/512 on ImageNet); the
    first stage keeps the stem's resolution, each later one halves it.
    ``stem="imagenet"`` is a 7x7 stride-2 convolution followed by a 3x3 stride-2
    max pool; ``stem="cifar"`` a 3x3 stride-1 convolution and no pooling
    (``maxpool`` is then an Identity, which has no parameters, so the keys do
    not change). ``zero_init_residual`` zeroes the last BatchNorm weight of
    every block, so each block starts as the identity.
    """

    def __init__(self, block, layers, num_classes=1000, widths=(64, 128, 256, 512), stem="imagenet",
                 zero_init_residual=False):
        super().__init__()
        if len(layers) != len(widths):
            raise ValueError(f"one block count per stage: got layers={layers} for widths={widths}")
        self.inplanes = widths[0]
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        elif stem == "cifar":
            self.conv1 = conv3x3(3, self.inplanes)
        else:
            raise ValueError(f"stem must be 'imagenet' or 'cifar', got {stem!r}")
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1) if stem == "imagenet" else nn.Identity()
        for i, (width, blocks) in enumerate(zip(widths, layers)):
            setattr(self, f"layer{i + 1}", self._make_layer(block, width, blocks, stride=1 if i == 0 else 2))
        self.num_stages = len(layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)
        self.zero_init_residual = zero_init_residual
        self.init_weights(np.random.default_rng())

    def _make_layer(self, block, planes, blocks, stride=1):
        if blocks < 1:
            raise ValueError(f"every stage needs at least one block, got {blocks}")
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            # Projection shortcut (option B): a strided 1x1 convolution and a BatchNorm.
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def init_weights(self, rng):
        """torchvision's initialization (also run by ``init_parameters(seed)``)."""
        zero_init_residual = self.zero_init_residual
        # torchvision's initialization; Linear keeps the layer default.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                _init.kaiming_normal_(m.weight, rng, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                _init.constant_(m.weight, 1)
                _init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    _init.constant_(m.bn3.weight, 0)
                elif isinstance(m, BasicBlock):
                    _init.constant_(m.bn2.weight, 0)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        x = self.avgpool(x)
        x = nn.functional.flatten(x, 1)
        return self.fc(x)


# -- torchvision's ImageNet ResNets -------------------------------------------------------------

def resnet18(num_classes=1000, **kwargs):
    """ResNet-18: BasicBlocks [2, 2, 2, 2]."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes, **kwargs)


def resnet34(num_classes=1000, **kwargs):
    """ResNet-34: BasicBlocks [3, 4, 6, 3]."""
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes=num_classes, **kwargs)


def resnet50(num_classes=1000, **kwargs):
    """ResNet-50: Bottlenecks [3, 4, 6, 3]."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes, **kwargs)


def resnet101(num_classes=1000, **kwargs):
    """ResNet-101: Bottlenecks [3, 4, 23, 3]."""
    return ResNet(Bottleneck, [3, 4, 23, 3], num_classes=num_classes, **kwargs)


def resnet152(num_classes=1000, **kwargs):
    """ResNet-152: Bottlenecks [3, 8, 36, 3]."""
    return ResNet(Bottleneck, [3, 8, 36, 3], num_classes=num_classes, **kwargs)


def resnet18_cifar(num_classes=10, **kwargs):
    """ResNet-18 for 32x32 images: 3x3 stride-1 stem, no max pool; resnet18's keys."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes, stem="cifar", **kwargs)


# -- CIFAR ResNets (He et al., section 4.2) -----------------------------------------------------

def resnet_cifar(depth, num_classes=10, **kwargs):
    """The CIFAR ResNet of ``depth`` = 6n + 2 layers: three stages of n BasicBlocks (16/32/64 channels)."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"a CIFAR ResNet has depth 6n + 2 (8, 14, 20, 32, 44, 56, 110, ...), got {depth}")
    n = (depth - 2) // 6
    return ResNet(BasicBlock, [n, n, n], num_classes=num_classes, widths=(16, 32, 64), stem="cifar", **kwargs)


def resnet20(num_classes=10, **kwargs):
    return resnet_cifar(20, num_classes, **kwargs)


def resnet32(num_classes=10, **kwargs):
    return resnet_cifar(32, num_classes, **kwargs)


def resnet44(num_classes=10, **kwargs):
    return resnet_cifar(44, num_classes, **kwargs)


def resnet56(num_classes=10, **kwargs):
    return resnet_cifar(56, num_classes, **kwargs)


def resnet110(num_classes=10, **kwargs):
    return resnet_cifar(110, num_classes, **kwargs)


# -- ImageNet Bottleneck ResNets of any depth ---------------------------------------------------

# Published stage layouts that the rule below does not reproduce.
_PUBLISHED_LAYERS = {101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}


def deep_layers(depth):
    """Bottleneck blocks per stage for an ImageNet ResNet of ``depth`` weight layers.

    Each Bottleneck has three convolutions and the stem convolution and ``fc``
    add two layers (shortcut projections are not counted), so depth must be
    3 * blocks + 2. ResNet-101 and -152 use their published layouts. Otherwise
    the first and last stages keep 3 blocks, as in every published ImageNet
    Bottleneck ResNet, and the other ``blocks - 6`` are split 2:3 between stages
    2 and 3 (rounded): this gives ResNet-50's [3, 4, 6, 3] and ResNet-200's
    [3, 24, 36, 3], and [3, 131, 196, 3] for depth 1001. Depth at least 26.
    """
    if depth < 26 or (depth - 2) % 3:
        raise ValueError(f"a Bottleneck ResNet has depth 3 * blocks + 2 with at least 8 blocks "
                         f"(26, 29, ..., 50, ..., 1001), got {depth}")
    if depth in _PUBLISHED_LAYERS:
        return list(_PUBLISHED_LAYERS[depth])
    rest = (depth - 2) // 3 - 6
    stage2 = round(rest * 2 / 5)
    return [3, stage2, rest - stage2, 3]


def resnet_deep(depth, num_classes=1000, **kwargs):
    """An ImageNet Bottleneck ResNet of ``depth`` layers (stage layout: :func:`deep_layers`).

    Deep means large: depth 1001 has about 270M parameters, mostly in stage 3.
    """
    return ResNet(Bottleneck, deep_layers(depth), num_classes=num_classes, **kwargs)
