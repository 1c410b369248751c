"""Small networks written once over a layer namespace (``minidnn.nn`` or ``torch.nn``) and a
``cat`` function, so that both frameworks get exactly the same structure and state_dict names."""


def make_lenet(nn, cat=None, dropout=False):
    class LeNet5(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2))
            self.flatten = nn.Flatten()
            self.classifier = nn.Sequential(
                nn.Linear(16 * 5 * 5, 120), nn.ReLU(), *([nn.Dropout(0.5)] if dropout else []),
                nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

        def forward(self, x):
            return self.classifier(self.flatten(self.features(x)))

    return LeNet5()


def make_resnet(nn, cat=None, dropout=False):
    class BasicBlock(nn.Module):
        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class SmallResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.layer1 = nn.Sequential(BasicBlock(8, 8))
            self.layer2 = nn.Sequential(BasicBlock(8, 16, stride=2, downsample=nn.Sequential(
                nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.flatten = nn.Flatten()
            self.drop = nn.Dropout(0.3) if dropout else nn.Identity()
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer2(self.layer1(x))
            return self.fc(self.drop(self.flatten(self.avgpool(x))))

    return SmallResNet()


def make_densenet(nn, cat):
    class DenseLayer(nn.Module):
        def __init__(self, cin, growth):
            super().__init__()
            self.norm = nn.BatchNorm2d(cin)
            self.relu = nn.ReLU()
            self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)

        def forward(self, x):
            return cat([x, self.conv(self.relu(self.norm(x)))], 1)

    class SmallDenseNet(nn.Module):
        def __init__(self, c0=8, growth=4, layers=3):
            super().__init__()
            self.conv0 = nn.Conv2d(3, c0, 3, padding=1, bias=False)  # a bias before BN gets zero gradient
            self.block = nn.Sequential(*[DenseLayer(c0 + i * growth, growth) for i in range(layers)])
            c = c0 + layers * growth
            self.transition = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1),
                                            nn.AvgPool2d(2))
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(c // 2 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(self.flatten(self.transition(self.block(self.conv0(x)))))

    return SmallDenseNet()


def make_resnet20(nn, cat=None, width=16):
    """ResNet-20 for CIFAR (He et al. 2016, section 4.2): three stages of three basic blocks at
    ``width``, 2x and 4x channels, 1x1 projection shortcuts where the shape changes."""
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
                             if stride != 1 or cin != cout else None)

        def forward(self, x):
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(out + (self.shortcut(x) if self.shortcut is not None else x))

    class ResNet20(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU()
            blocks, cin = [], width
            for i, cout in enumerate((width, 2 * width, 4 * width)):
                for j in range(3):
                    blocks.append(Block(cin, cout, 2 if i > 0 and j == 0 else 1))
                    cin = cout
            self.layers = nn.Sequential(*blocks)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(4 * width, 10)

        def forward(self, x):
            return self.fc(self.flatten(self.avgpool(self.layers(self.relu(self.bn1(self.conv1(x)))))))

    return ResNet20()


def make_vgg11_bn(nn, cat=None, width_div=4):
    """VGG-11 with BatchNorm (configuration A), its channels divided by ``width_div``, for 32x32 inputs."""
    cfg = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]

    class VGG11BN(nn.Module):
        def __init__(self):
            super().__init__()
            layers, cin = [], 3
            for v in cfg:
                if v == "M":
                    layers.append(nn.MaxPool2d(2, 2))
                else:
                    layers += [nn.Conv2d(cin, v // width_div, 3, padding=1), nn.BatchNorm2d(v // width_div), nn.ReLU()]
                    cin = v // width_div
            self.features = nn.Sequential(*layers)
            self.flatten = nn.Flatten()
            self.classifier = nn.Sequential(nn.Linear(cin, cin), nn.ReLU(), nn.Linear(cin, 10))

        def forward(self, x):
            return self.classifier(self.flatten(self.features(x)))

    return VGG11BN()
