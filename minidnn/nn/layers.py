"""The layers: each owns its parameters and calls one functional op."""
from __future__ import annotations

import numbers

import numpy as np

from .. import ops
from ..ops.interpolate import check_arguments as check_interpolate_arguments
from ..ops.pool import adaptive_size
from . import init
from .module import Buffer, Module, Parameter


def _rng(seed=None):
    return np.random.default_rng(seed)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class _Conv(Module):
    """A convolution's weight (initialized from its own shape, as PyTorch does) and optional bias."""

    def _make_parameters(self, shape, bias):
        self.weight = Parameter(np.empty(shape, np.float32))
        self.bias = Parameter(np.empty(self.out_channels, np.float32)) if bias else None
        self.reset_parameters(_rng())

    def reset_parameters(self, rng):
        self.weight.data[...] = init.kaiming_uniform(rng, self.weight.shape)
        if self.bias is not None:
            self.bias.data[...] = init.bias_uniform(rng, self.weight.shape, self.out_channels)


class Conv2d(_Conv):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros"):
        super().__init__()
        if padding_mode != "zeros":
            raise ValueError(f"padding_mode {padding_mode!r} is not supported (only 'zeros')")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"channels ({in_channels}, {out_channels}) must be divisible by groups={groups}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation, self.groups = _pair(padding), _pair(dilation), groups
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self._make_parameters(shape, bias)

    def forward(self, x):
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class ConvTranspose2d(_Conv):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0,
                 groups=1, bias=True, dilation=1):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = _pair(kernel_size), _pair(stride), _pair(padding)
        self.output_padding, self.dilation, self.groups = _pair(output_padding), _pair(dilation), groups
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        self._make_parameters(shape, bias)

    def forward(self, x):
        return ops.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                    self.output_padding, self.groups, self.dilation)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(np.empty((out_features, in_features), np.float32))
        self.bias = Parameter(np.empty(out_features, np.float32)) if bias else None
        self.reset_parameters(_rng())

    def reset_parameters(self, rng):
        self.weight.data[...] = init.kaiming_uniform(rng, self.weight.shape)
        if self.bias is not None:
            self.bias.data[...] = init.bias_uniform(rng, self.weight.shape, self.out_features)

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"


class _BatchNorm(Module):
    """BatchNorm's parameters and running statistics, PyTorch's names; subclasses pick the op."""

    fn = None

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__()
        if not affine or not track_running_stats:
            raise ValueError(f"{type(self).__name__} supports affine=True, track_running_stats=True only")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter(np.ones(num_features, np.float32))
        self.bias = Parameter(np.zeros(num_features, np.float32))
        self.register_buffer("running_mean", np.zeros(num_features, np.float32))
        self.register_buffer("running_var", np.ones(num_features, np.float32))
        self.register_buffer("num_batches_tracked", np.zeros((), np.int64))

    def reset_parameters(self, rng):
        self.weight.data[...] = 1
        self.bias.data[...] = 0
        self.running_mean.data[...] = 0
        self.running_var.data[...] = 1
        self.num_batches_tracked.data[...] = 0

    def forward(self, x):
        return type(self).fn(x, self.weight, self.bias, self.running_mean, self.running_var,
                             self.training, self.momentum, self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm2d(_BatchNorm):
    """Per channel over (N, H, W) of (N, C, H, W)."""

    fn = staticmethod(ops.batch_norm2d)


class BatchNorm1d(_BatchNorm):
    """Per channel over N of (N, C), or over (N, L) of (N, C, L): BatchNorm2d's op on a 4-D view."""

    fn = staticmethod(ops.batch_norm1d)


class LayerNorm(Module):
    """Normalizes over the last ``len(normalized_shape)`` dimensions; ``weight`` and ``bias`` have
    ``normalized_shape`` (PyTorch's layout) unless ``elementwise_affine=False`` (or ``bias=False``)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else normalized_shape
        self.normalized_shape = tuple(int(d) for d in shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, np.float32)) if affine and bias else None

    def reset_parameters(self, rng):
        if self.weight is not None:
            self.weight.data[...] = 1
        if self.bias is not None:
            self.bias.data[...] = 0

    def forward(self, x):
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """Normalizes each of ``num_groups`` groups of channels of each sample; ``weight`` and ``bias``
    per channel."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True):
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = Parameter(np.ones(num_channels, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_channels, np.float32)) if affine else None

    def reset_parameters(self, rng):
        if self.affine:
            self.weight.data[...] = 1
            self.bias.data[...] = 0

    def forward(self, x):
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _Activation(Module):
    fn = None

    def forward(self, x):
        return type(self).fn(x)


class ReLU(_Activation):
    fn = staticmethod(ops.relu)

    def __init__(self, inplace=False):  # inplace is accepted for PyTorch compatibility; buffers are planned
        super().__init__()


class Sigmoid(_Activation):
    fn = staticmethod(ops.sigmoid)


class Tanh(_Activation):
    fn = staticmethod(ops.tanh)


class SiLU(_Activation):
    fn = staticmethod(ops.silu)

    def __init__(self, inplace=False):
        super().__init__()


class GELU(Module):
    """``approximate="none"``: x * Phi(x) (erf); ``"tanh"``: PyTorch's tanh approximation."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return ops.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return ops.leaky_relu(x, self.negative_slope)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        super().__init__()
        if ceil_mode:
            raise ValueError("MaxPool2d: ceil_mode=True is not supported")
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation

    def forward(self, x):
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__()
        if ceil_mode:
            raise ValueError("AvgPool2d: ceil_mode=True is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.count_include_pad = count_include_pad

    def forward(self, x):
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.count_include_pad)


class _AdaptivePool2d(Module):
    """Pooling over PyTorch's adaptive windows: output row i of OH reads input rows floor(i*H/OH)
    to ceil((i+1)*H/OH), columns likewise. ``output_size``: an int, or (h, w) where None keeps
    that dimension of the input."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = adaptive_size(output_size, type(self).__name__)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveAvgPool2d(_AdaptivePool2d):
    """The mean of each adaptive window (see ``_AdaptivePool2d``); (1, 1) is the global average."""

    def forward(self, x):
        return ops.adaptive_avg_pool2d(x, self.output_size)


class AdaptiveMaxPool2d(_AdaptivePool2d):
    """The maximum of each adaptive window (the first of equal maxima, as in PyTorch)."""

    def __init__(self, output_size, return_indices=False):
        if return_indices:
            raise ValueError("AdaptiveMaxPool2d: return_indices=True is not supported")
        super().__init__(output_size)

    def forward(self, x):
        return ops.adaptive_max_pool2d(x, self.output_size)


class Upsample(Module):
    """Resizes (N, C, H, W) to ``size`` or by ``scale_factor``, mode 'nearest' or 'bilinear'
    (``align_corners`` False by default), as PyTorch's."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        check_interpolate_arguments(size, scale_factor, mode, align_corners)
        self.size, self.mode, self.align_corners = size, mode, align_corners
        self.scale_factor = scale_factor
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return ops.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                               self.recompute_scale_factor)

    def extra_repr(self):
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return ops.flatten(x, self.start_dim, self.end_dim)


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x):
        return ops.dropout(x, self.p) if self.training and self.p > 0 else x


class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class CrossEntropyLoss(Module):
    def __init__(self, label_smoothing=0.0, reduction="mean"):
        super().__init__()
        if label_smoothing != 0.0 or reduction != "mean":
            raise ValueError("CrossEntropyLoss supports label_smoothing=0 and reduction='mean'")

    def label_spec(self, out):
        """Class indices, one per row of the logits."""
        return (out.shape[0],), np.dtype(np.int64)

    def forward(self, logits, labels):
        return ops.cross_entropy(logits, labels)


class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction != "mean":
            raise ValueError("MSELoss supports reduction='mean'")

    def label_spec(self, out):
        """Targets shaped like the prediction."""
        return out.shape, out.dtype

    def forward(self, pred, target):
        return ops.mse_loss(pred, target)
