"""U-Net (Ronneberger et al., 2015) for per-pixel prediction.

An encoder of ``depth`` levels (two 3x3 convolutions, then a 2x2 max pool,
doubling the channels from ``base``), a bottleneck, and a decoder that doubles
the resolution with a stride-2 ``ConvTranspose2d``, concatenates the encoder's
feature map of that level (the skip connection, ``nn.functional.cat``) and
applies two 3x3 convolutions. A final 1x1 convolution ``head`` gives
``num_classes`` maps.

Unlike the paper, the convolutions are padded (``padding=1``), so the output
(N, num_classes, H, W) has the input's size and no cropping is needed; H and W
must be divisible by ``2 ** depth``. ``batch_norm=True`` (the default) puts a
BatchNorm after each 3x3 convolution, which then has no bias.

Losses: minidnn's ``CrossEntropyLoss`` takes (N, K) logits only, so it does
not apply to the (N, K, H, W) output directly; ``MSELoss`` against a target of
the output's shape (e.g. one-hot masks, or an image for denoising) does.
"""
from __future__ import annotations

from minidnn import nn
from minidnn.errors import ShapeError


class DoubleConv(nn.Sequential):
    """(3x3 convolution, [BatchNorm], ReLU) twice, keeping the spatial size."""

    def __init__(self, in_channels, out_channels, batch_norm=True):
        layers = []
        for c_in in (in_channels, out_channels):
            layers.append(nn.Conv2d(c_in, out_channels, kernel_size=3, padding=1, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2d(out_channels))
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


class UNet(nn.Module):
    def __init__(self, in_channels=3, num_classes=2, base=64, depth=4, batch_norm=True):
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth = depth
        widths = [base * 2 ** i for i in range(depth + 1)]  # 64, 128, 256, 512, 1024
        self.encoder = nn.ModuleList(
            [DoubleConv(in_channels, widths[0], batch_norm)]
            + [DoubleConv(widths[i], widths[i + 1], batch_norm) for i in range(depth - 1)]
        )
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.bottleneck = DoubleConv(widths[depth - 1], widths[depth], batch_norm)
        # Decoder, deepest level first: up-sample to the level's width, then convolve the concatenation
        # of skip and up-sampled maps (2 * width channels) back to width.
        self.upconvs = nn.ModuleList(
            [nn.ConvTranspose2d(widths[i + 1], widths[i], kernel_size=2, stride=2) for i in reversed(range(depth))]
        )
        self.decoder = nn.ModuleList(
            [DoubleConv(2 * widths[i], widths[i], batch_norm) for i in reversed(range(depth))]
        )
        self.head = nn.Conv2d(widths[0], num_classes, kernel_size=1)

    def forward(self, x):
        h, w = x.shape[2], x.shape[3]
        m = 2 ** self.depth
        if h % m or w % m:
            raise ShapeError(f"UNet: input {h}x{w} must be divisible by 2**depth = {m} in both dimensions")
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for up, block, skip in zip(self.upconvs, self.decoder, reversed(skips)):
            x = block(nn.functional.cat([skip, up(x)], 1))
        return self.head(x)


def unet(in_channels=3, num_classes=2, base=64, depth=4, **kwargs):
    """U-Net with padded convolutions: (N, in_channels, H, W) -> (N, num_classes, H, W)."""
    return UNet(in_channels=in_channels, num_classes=num_classes, base=base, depth=depth, **kwargs)
