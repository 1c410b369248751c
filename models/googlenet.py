"""GoogLeNet (Inception v1, Szegedy et al., 2014) as in torchvision, without the auxiliary heads.

Names equal torchvision's ``googlenet(aux_logits=False)``: ``conv1.conv``,
``conv1.bn``, ``inception3a.branch1.conv``, ``inception3a.branch2.1.conv`` ...
``fc``; 6,624,904 parameters for 1000 classes. Like torchvision, branch3 uses
a 3x3 convolution where the paper has 5x5, and every convolution is a
:class:`BasicConv2d` (conv without bias, BatchNorm with eps 0.001, ReLU).

Differences from torchvision, none of which changes a parameter:

* torchvision's stride-2 max pools use ``ceil_mode=True``, which minidnn does
  not have. ``maxpool1``-``maxpool3`` (3x3, stride 2) use ``padding=1``
  instead; for an even input size s both give s/2 outputs, so at 224x224 the
  feature maps are torchvision's 112, 56, 28, 14 and 7. The windows are placed
  one pixel earlier (they overhang the top/left edge instead of the
  bottom/right one), so outputs are not bit-identical to torchvision's.
  ``maxpool4`` (2x2, stride 2) needs no change at even sizes.
* No auxiliary classifiers (``aux_logits=False``) and no ``transform_input``.
"""
from __future__ import annotations

import numpy as np

from minidnn import nn

from . import _init


class BasicConv2d(nn.Module):
    """Convolution (no bias), BatchNorm (eps 0.001), ReLU."""

    def __init__(self, in_channels, out_channels, **kwargs):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x):
        return nn.functional.relu(self.bn(self.conv(x)))


class Inception(nn.Module):
    """Four parallel branches concatenated along the channels."""

    def __init__(self, in_channels, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj):
        super().__init__()
        self.branch1 = BasicConv2d(in_channels, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(
            BasicConv2d(in_channels, ch3x3red, kernel_size=1),
            BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1),
        )
        self.branch3 = nn.Sequential(
            BasicConv2d(in_channels, ch5x5red, kernel_size=1),
            # torchvision (and its pretrained weights) use 3x3 here, the paper 5x5.
            BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1),
        )
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
            BasicConv2d(in_channels, pool_proj, kernel_size=1),
        )

    def forward(self, x):
        outputs = [self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)]
        return nn.functional.cat(outputs, 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes=1000, aux_logits=False, transform_input=False, init_weights=True,
                 dropout=0.2):
        super().__init__()
        if aux_logits:
            raise ValueError("GoogLeNet: the auxiliary classifiers are not implemented (use aux_logits=False)")
        if transform_input:
            raise ValueError("GoogLeNet: transform_input is not implemented; normalize the input instead")
        self.aux_logits = False
        self.transform_input = False

        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, padding=1)  # torchvision: ceil_mode=True, no padding
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, padding=1)  # ditto

        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, stride=2, padding=1)  # ditto

        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, stride=2)  # torchvision: ceil_mode=True, the same at even sizes

        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)

        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(1024, num_classes)
        if init_weights:
            self.init_weights(np.random.default_rng())

    def init_weights(self, rng):
        """The network's own initialization (also run by ``init_parameters(seed)``)."""
        # torchvision's initialization: truncated normal(0, 0.01) weights; Linear bias keeps its default.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                _init.trunc_normal_(m.weight, rng, std=0.01, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                _init.constant_(m.weight, 1)
                _init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        for block in (self.inception4a, self.inception4b, self.inception4c, self.inception4d, self.inception4e):
            x = block(x)
        x = self.maxpool4(x)
        x = self.inception5b(self.inception5a(x))
        x = self.avgpool(x)
        x = nn.functional.flatten(x, 1)
        x = self.dropout(x)
        return self.fc(x)


def googlenet(num_classes=1000, **kwargs):
    """GoogLeNet for 3x224x224 images, torchvision's names, without auxiliary heads."""
    return GoogLeNet(num_classes=num_classes, **kwargs)
