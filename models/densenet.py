"""DenseNet-BC (Huang et al., 2016) as in torchvision.

Names equal torchvision's: ``features.conv0/norm0/relu0/pool0``,
``features.denseblock1.denselayer1.norm1/relu1/conv1/norm2/relu2/conv2``,
``features.transition1.norm/relu/conv/pool``, ``features.norm5`` and
``classifier``. Each dense layer reads the concatenation of every earlier
feature map of its block (``nn.functional.cat``) and adds ``growth_rate``
channels; its 1x1 bottleneck has ``bn_size * growth_rate`` channels. A
transition halves the channels and the resolution.

``densenet_small`` is a small CIFAR-size DenseNet-BC for tests and examples:
a 3x3 stride-1 stem without ``pool0``, growth 12 and three blocks of two layers.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from minidnn import nn

from . import _init


class _DenseLayer(nn.Module):
    def __init__(self, num_input_features, growth_rate, bn_size, drop_rate=0.0):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, kernel_size=1, stride=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1, padding=1, bias=False)
        self.drop_rate = float(drop_rate)

    def forward(self, inputs):
        """``inputs``: the list of the block's feature maps so far."""
        x = nn.functional.cat(inputs, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        x = self.conv2(self.relu2(self.norm2(x)))
        if self.drop_rate > 0 and self.training:
            x = nn.functional.dropout(x, self.drop_rate)
        return x


class _DenseBlock(nn.Module):
    def __init__(self, num_layers, num_input_features, bn_size, growth_rate, drop_rate=0.0):
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate, bn_size, drop_rate)
            setattr(self, f"denselayer{i + 1}", layer)

    def forward(self, x):
        features = [x]
        for layer in self.children():
            features.append(layer(features))
        return nn.functional.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, num_input_features, num_output_features):
        super().__init__(OrderedDict([
            ("norm", nn.BatchNorm2d(num_input_features)),
            ("relu", nn.ReLU(inplace=True)),
            ("conv", nn.Conv2d(num_input_features, num_output_features, kernel_size=1, stride=1, bias=False)),
            ("pool", nn.AvgPool2d(kernel_size=2, stride=2)),
        ]))


class DenseNet(nn.Module):
    """DenseNet-BC.

    ``stem="imagenet"``: 7x7 stride-2 convolution and 3x3 stride-2 max pool
    (torchvision); ``stem="cifar"``: a 3x3 stride-1 convolution and no pool.
    """

    def __init__(self, growth_rate=32, block_config=(6, 12, 24, 16), num_init_features=64, bn_size=4,
                 drop_rate=0.0, num_classes=1000, stem="imagenet"):
        super().__init__()
        if stem == "imagenet":
            stem_layers = [
                ("conv0", nn.Conv2d(3, num_init_features, kernel_size=7, stride=2, padding=3, bias=False)),
                ("norm0", nn.BatchNorm2d(num_init_features)),
                ("relu0", nn.ReLU(inplace=True)),
                ("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1)),
            ]
        elif stem == "cifar":
            stem_layers = [
                ("conv0", nn.Conv2d(3, num_init_features, kernel_size=3, stride=1, padding=1, bias=False)),
                ("norm0", nn.BatchNorm2d(num_init_features)),
                ("relu0", nn.ReLU(inplace=True)),
            ]
        else:
            raise ValueError(f"stem must be 'imagenet' or 'cifar', got {stem!r}")
        self.features = nn.Sequential(OrderedDict(stem_layers))

        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            block = _DenseBlock(num_layers, num_features, bn_size, growth_rate, drop_rate)
            setattr(self.features, f"denseblock{i + 1}", block)
            num_features += num_layers * growth_rate
            if i != len(block_config) - 1:
                setattr(self.features, f"transition{i + 1}", _Transition(num_features, num_features // 2))
                num_features //= 2
        self.features.norm5 = nn.BatchNorm2d(num_features)
        self.classifier = nn.Linear(num_features, num_classes)
        self.init_weights(np.random.default_rng())

    def init_weights(self, rng):
        """The network's own initialization (also run by ``init_parameters(seed)``)."""
        # torchvision's initialization ("official init from torch repo").
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                _init.kaiming_normal_(m.weight, rng, mode="fan_in")
            elif isinstance(m, nn.BatchNorm2d):
                _init.constant_(m.weight, 1)
                _init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                _init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.features(x)
        x = nn.functional.relu(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = nn.functional.flatten(x, 1)
        return self.classifier(x)


def densenet121(num_classes=1000, **kwargs):
    """DenseNet-121: growth 32, blocks (6, 12, 24, 16), 64 stem channels."""
    return DenseNet(32, (6, 12, 24, 16), 64, num_classes=num_classes, **kwargs)


def densenet161(num_classes=1000, **kwargs):
    """DenseNet-161: growth 48, blocks (6, 12, 36, 24), 96 stem channels."""
    return DenseNet(48, (6, 12, 36, 24), 96, num_classes=num_classes, **kwargs)


def densenet169(num_classes=1000, **kwargs):
    """DenseNet-169: growth 32, blocks (6, 12, 32, 32), 64 stem channels."""
    return DenseNet(32, (6, 12, 32, 32), 64, num_classes=num_classes, **kwargs)


def densenet201(num_classes=1000, **kwargs):
    """DenseNet-201: growth 32, blocks (6, 12, 48, 32), 64 stem channels."""
    return DenseNet(32, (6, 12, 48, 32), 64, num_classes=num_classes, **kwargs)


def densenet_small(num_classes=10, growth_rate=12, block_config=(2, 2, 2), num_init_features=24, **kwargs):
    """A small DenseNet-BC for 3x32x32 images: 3x3 stem, growth 12, blocks (2, 2, 2)."""
    return DenseNet(growth_rate, block_config, num_init_features, num_classes=num_classes, stem="cifar", **kwargs)
