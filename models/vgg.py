"""VGG 11/13/16/19 (Simonyan & Zisserman, 2014), with and without BatchNorm, as in torchvision.

Names equal torchvision's: ``features.<i>`` (the conv/BN/ReLU/pool stack),
``avgpool`` and ``classifier.0/3/6`` (the Linear layers; 2 and 5 are Dropout).

``avgpool`` is ``AdaptiveAvgPool2d((s, s))`` with ``s = image_size // 32``, and
the first Linear layer takes ``512 * s * s`` features. At the default
``image_size=224`` that is torchvision's model, ``AdaptiveAvgPool2d((7, 7))``,
and as torchvision's it takes any input of at least 32x32 (a 64x64 image's 2x2
features are spread over the 7x7 windows). A smaller ``image_size`` (32 for
CIFAR) keeps the convolution stack and the state_dict keys and shrinks only
``classifier.0``.
"""
from __future__ import annotations

import numpy as np

from minidnn import nn

from . import _init

# Channels of each 3x3 convolution, "M" for a 2x2 max pool (torchvision's configurations A, B, D, E).
cfgs = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "B": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "E": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
          512, 512, 512, 512, "M"],
}


def make_layers(cfg, batch_norm=False, in_channels=3):
    layers = []
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers.append(nn.Conv2d(in_channels, v, kernel_size=3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(v))
            layers.append(nn.ReLU(inplace=True))
            in_channels = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self, features, num_classes=1000, init_weights=True, dropout=0.5, image_size=224):
        super().__init__()
        if image_size < 32:
            raise ValueError(f"VGG halves the image five times: image_size must be at least 32, got {image_size}")
        s = image_size // 32
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((s, s))
        self.classifier = nn.Sequential(
            nn.Linear(512 * s * s, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )
        if init_weights:
            self.init_weights(np.random.default_rng())

    def init_weights(self, rng):
        """The network's own initialization (also run by ``init_parameters(seed)``)."""
        # torchvision's initialization.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                _init.kaiming_normal_(m.weight, rng, mode="fan_out")
                if m.bias is not None:
                    _init.constant_(m.bias, 0)
            elif isinstance(m, nn.BatchNorm2d):
                _init.constant_(m.weight, 1)
                _init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                _init.normal_(m.weight, rng, 0.01)
                _init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = nn.functional.flatten(x, 1)
        return self.classifier(x)


def _vgg(cfg, batch_norm, num_classes, image_size, **kwargs):
    return VGG(make_layers(cfgs[cfg], batch_norm=batch_norm), num_classes=num_classes,
               image_size=image_size, **kwargs)


def vgg11(num_classes=1000, image_size=224, **kwargs):
    """VGG-11 (configuration A)."""
    return _vgg("A", False, num_classes, image_size, **kwargs)


def vgg11_bn(num_classes=1000, image_size=224, **kwargs):
    """VGG-11 with BatchNorm after each convolution."""
    return _vgg("A", True, num_classes, image_size, **kwargs)


def vgg13(num_classes=1000, image_size=224, **kwargs):
    """VGG-13 (configuration B)."""
    return _vgg("B", False, num_classes, image_size, **kwargs)


def vgg13_bn(num_classes=1000, image_size=224, **kwargs):
    """VGG-13 with BatchNorm after each convolution."""
    return _vgg("B", True, num_classes, image_size, **kwargs)


def vgg16(num_classes=1000, image_size=224, **kwargs):
    """VGG-16 (configuration D)."""
    return _vgg("D", False, num_classes, image_size, **kwargs)


def vgg16_bn(num_classes=1000, image_size=224, **kwargs):
    """VGG-16 with BatchNorm after each convolution."""
    return _vgg("D", True, num_classes, image_size, **kwargs)


def vgg19(num_classes=1000, image_size=224, **kwargs):
    """VGG-19 (configuration E)."""
    return _vgg("E", False, num_classes, image_size, **kwargs)


def vgg19_bn(num_classes=1000, image_size=224, **kwargs):
    """VGG-19 with BatchNorm after each convolution."""
    return _vgg("E", True, num_classes, image_size, **kwargs)
