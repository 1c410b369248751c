"""The layer API, with PyTorch's names, arguments, parameter names and layouts."""
from . import functional, init
from .functional import add, cat, flatten, relu
from .layers import (AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm2d, Conv2d, ConvTranspose2d,
                     CrossEntropyLoss, Dropout, Flatten, Identity, LeakyReLU, Linear, MaxPool2d, MSELoss, ReLU,
                     Sigmoid, Tanh)
from .module import Buffer, Module, ModuleList, Parameter, Sequential

__all__ = ["functional", "init", "add", "cat", "flatten", "relu", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d",
           "AvgPool2d", "BatchNorm2d", "Conv2d", "ConvTranspose2d", "CrossEntropyLoss", "Dropout", "Flatten",
           "Identity", "LeakyReLU", "Linear", "MaxPool2d", "MSELoss", "ReLU", "Sigmoid", "Tanh", "Buffer", "Module",
           "ModuleList", "Parameter", "Sequential"]
