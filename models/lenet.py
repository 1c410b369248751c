"""LeNet-5 (LeCun et al., 1998), with ReLU and max pooling as it is usually written today.

    conv 6@5x5 -> ReLU -> MaxPool 2 -> conv 16@5x5 -> ReLU -> MaxPool 2 -> Flatten
    -> Linear 120 -> ReLU -> Linear 84 -> ReLU -> Linear num_classes

The original network reads 32x32 images. For 28x28 images (MNIST) the first
convolution is padded by 2, so both sizes reach the same 16x5x5 feature map and
the same 61,706 parameters (10 classes, one input channel).
"""
from __future__ import annotations

from minidnn import nn


class LeNet5(nn.Module):
    def __init__(self, num_classes=10, in_channels=1, image_size=28, padding=None):
        super().__init__()
        if padding is None:
            padding = 2 if image_size == 28 else 0
        # Two (5x5 conv, 2x2 pool) stages: the spatial size of the last feature map.
        size = ((image_size + 2 * padding - 4) // 2 - 4) // 2
        if size < 1:
            raise ValueError(f"LeNet-5 needs images of at least 16x16 pixels (with padding), got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(16 * size * size, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


def lenet5(num_classes=10, in_channels=1, image_size=28, **kwargs):
    """LeNet-5 for ``in_channels`` x ``image_size`` x ``image_size`` images (28: first conv padded by 2)."""
    return LeNet5(num_classes=num_classes, in_channels=in_channels, image_size=image_size, **kwargs)
