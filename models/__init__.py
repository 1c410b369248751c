"""Reference networks written with minidnn's layer API, and a registry of them by name.

    from minidnn import models
    net = models.resnet18()                     # or models.get("resnet18")
    models.default_input("resnet18")           # (3, 224, 224)
    models.names()                             # every registered name

Where torchvision has the model, module and parameter names (hence
``state_dict()`` keys and shapes) are torchvision's, so its weights load.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Callable

from .alexnet import AlexNet, alexnet
from .densenet import DenseNet, densenet121, densenet161, densenet169, densenet201, densenet_small
from .googlenet import BasicConv2d, GoogLeNet, Inception, googlenet
from .lenet import LeNet5, lenet5
from .resnet import (BasicBlock, Bottleneck, ResNet, deep_layers, resnet18, resnet18_cifar, resnet20, resnet32,
                     resnet34, resnet44, resnet50, resnet56, resnet101, resnet110, resnet152, resnet_cifar,
                     resnet_deep)
from .unet import UNet, unet
from .vgg import VGG, vgg11, vgg11_bn, vgg13, vgg13_bn, vgg16, vgg16_bn, vgg19, vgg19_bn


@dataclass(frozen=True)
class ModelInfo:
    """A registered model: its factory, default input (C, H, W), class count and default arguments."""

    name: str
    factory: Callable
    input_shape: tuple
    num_classes: int
    defaults: dict = field(default_factory=dict)

    def build(self, **kwargs):
        return self.factory(**{**self.defaults, **kwargs})


_REGISTRY: dict[str, ModelInfo] = {}


def register(name, factory, input_shape, num_classes, **defaults):
    """Add ``factory`` under ``name``; ``defaults`` are keyword arguments :func:`get` passes to it."""
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = ModelInfo(name, factory, tuple(input_shape), int(num_classes), dict(defaults))


IMAGENET = (3, 224, 224)
CIFAR = (3, 32, 32)

register("lenet5", lenet5, (1, 28, 28), 10)
register("alexnet", alexnet, IMAGENET, 1000)
for _f in (vgg11, vgg11_bn, vgg13, vgg13_bn, vgg16, vgg16_bn, vgg19, vgg19_bn):
    register(_f.__name__, _f, IMAGENET, 1000)
for _f in (resnet18, resnet34, resnet50, resnet101, resnet152):
    register(_f.__name__, _f, IMAGENET, 1000)
register("resnet18_cifar", resnet18_cifar, CIFAR, 10)
for _f in (resnet20, resnet32, resnet44, resnet56, resnet110):
    register(_f.__name__, _f, CIFAR, 10)
register("resnet_cifar", resnet_cifar, CIFAR, 10, depth=20)
register("resnet_deep", resnet_deep, IMAGENET, 1000, depth=1001)
register("googlenet", googlenet, IMAGENET, 1000)
for _f in (densenet121, densenet161, densenet169, densenet201):
    register(_f.__name__, _f, IMAGENET, 1000)
register("densenet_small", densenet_small, CIFAR, 10)
register("unet", unet, (3, 256, 256), 2)
del _f


def names():
    """Every registered model name, in registration order (grouped by family)."""
    return list(_REGISTRY)


def info(name) -> ModelInfo:
    """The registry entry of ``name``; ValueError naming the closest names if there is none."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), names(), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} (models.names() lists all {len(_REGISTRY)})") from None


def get(name, **kwargs):
    """Build the model ``name``; ``kwargs`` (e.g. ``num_classes=10``) go to its factory."""
    return info(name).build(**kwargs)


def default_input(name):
    """The input (C, H, W) the model is made for, e.g. (3, 224, 224); add the batch size to trace it."""
    return info(name).input_shape


def default_num_classes(name):
    """The number of classes (U-Net: output channels) the model has by default."""
    return info(name).num_classes


__all__ = [
    "ModelInfo", "register", "names", "info", "get", "default_input", "default_num_classes",
    "AlexNet", "alexnet", "DenseNet", "densenet121", "densenet161", "densenet169", "densenet201",
    "densenet_small", "BasicConv2d", "GoogLeNet", "Inception", "googlenet", "LeNet5", "lenet5", "BasicBlock",
    "Bottleneck", "ResNet", "deep_layers", "resnet18", "resnet18_cifar", "resnet20", "resnet32", "resnet34",
    "resnet44", "resnet50", "resnet56", "resnet101", "resnet110", "resnet152", "resnet_cifar", "resnet_deep",
    "UNet", "unet", "VGG", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
]
