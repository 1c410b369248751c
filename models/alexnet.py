"""AlexNet as in torchvision (the "one weird trick" variant: 64-192-384-256-256 channels).

Module and parameter names equal torchvision's (``features.0.weight`` ...
``classifier.6.bias``), so a torchvision state_dict loads as is.

``avgpool`` is torchvision's ``AdaptiveAvgPool2d((6, 6))``, so as torchvision's
the model takes any input its features do not shrink to nothing (224 -> 55 ->
27 -> 13 -> 6, where the pool is the identity; 96 -> 23 -> 11 -> 5 -> 2). A
32x32 image shrinks below the last pooling window: tracing raises
:class:`~minidnn.errors.ShapeError` naming ``features.12``.
"""
from __future__ import annotations

from minidnn import nn


class AlexNet(nn.Module):
    def __init__(self, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = nn.functional.flatten(x, 1)
        return self.classifier(x)


def alexnet(num_classes=1000, **kwargs):
    """AlexNet (3x224x224 images by default, other sizes too), torchvision's layout and parameter names."""
    return AlexNet(num_classes=num_classes, **kwargs)
