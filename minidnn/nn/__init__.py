"""The layer API, with PyTorch's names, arguments, parameter names and layouts."""
from . import functional, init
from .functional import add, cat, flatten, relu
from .layers import (GELU, AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d,
                     ConvTranspose2d, CrossEntropyLoss, Dropout, Flatten, GroupNorm, Identity, LayerNorm, LeakyReLU,
                     Linear, MaxPool2d, MSELoss, ReLU, Sigmoid, SiLU, Tanh, Upsample)
from .module import Buffer, Module, ModuleList, Parameter, Sequential

__all__ = ["functional", "init", "add", "cat", "flatten", "relu", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d",
           "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv2d", "ConvTranspose2d", "CrossEntropyLoss", "Dropout",
           "Flatten", "GELU", "GroupNorm", "Identity", "LayerNorm", "LeakyReLU", "Linear", "MaxPool2d", "MSELoss",
           "ReLU", "Sigmoid", "SiLU", "Tanh", "Upsample", "Buffer", "Module", "ModuleList", "Parameter",
           "Sequential"]
