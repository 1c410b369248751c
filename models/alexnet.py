"""AlexNet as in torchvision (the "one weird trick" variant: 64-192-384-256-256 channels).

Module and parameter names equal torchvision's (``features.0.weight`` ...
``classifier.6.bias``), so a torchvision state_dict loads as is.

torchvision ends the features with ``AdaptiveAvgPool2d((6, 6))``. minidnn's
adaptive pooling only reduces to 1x1, so ``avgpool`` is an ``Identity`` here:
the input must give a 6x6 feature map, which a 224x224 image does (224 -> 55
-> 27 -> 13 -> 6); for 224x224 inputs the two are the same function. Other
sizes raise :class:`~minidnn.errors.ShapeError` while tracing, naming the layer
(a 32x32 image shrinks below the last pooling window at ``features.12``).
"""
from __future__ import annotations

from minidnn import nn
from minidnn.errors import ShapeError


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
        self.avgpool = nn.Identity()  # torchvision: AdaptiveAvgPool2d((6, 6)); see the module docstring
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
        if tuple(x.shape[2:]) != (6, 6):
            raise ShapeError(f"avgpool: AlexNet needs a 6x6 feature map here (a 224x224 input), got "
                             f"{x.shape[2]}x{x.shape[3]}; AdaptiveAvgPool2d((6, 6)) is not available")
        x = self.avgpool(x)
        x = nn.functional.flatten(x, 1)
        return self.classifier(x)


def alexnet(num_classes=1000, **kwargs):
    """AlexNet for 3x224x224 images, torchvision's layout and parameter names."""
    return AlexNet(num_classes=num_classes, **kwargs)
