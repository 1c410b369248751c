"""The reference models: output shapes, torchvision layouts, registry, CIFAR/deep ResNets, init.

Tracing runs no kernel, so even ImageNet models trace in milliseconds; what
costs is drawing the weights (seconds for a VGG). Tests that only look at
shapes therefore build under :func:`cheap_weights`, which skips the random
initialization; the tests of the initialization itself build normally.
"""

import contextlib
import hashlib
import json
import pathlib
import time

import numpy as np
import pytest

from minidnn import nn
from minidnn.errors import ShapeError
from minidnn.graph import trace

try:
    from minidnn import models
except ImportError:  # the repository's top-level models/ folder before it is installed as minidnn.models
    import models

try:
    import torch
    import torchvision.models as tv_models
except Exception:  # not installed, or built for another torch
    torch = tv_models = None

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "torchvision_specs.json"
SPECS = json.loads(FIXTURE.read_text())["models"]


@contextlib.contextmanager
def cheap_weights():
    """Build models without drawing random weights (shape and layout tests never read them)."""
    with pytest.MonkeyPatch.context() as mp:
        for cls in (nn.Conv2d, nn.ConvTranspose2d, nn.Linear):
            if hasattr(cls, "reset_parameters"):
                mp.setattr(cls, "reset_parameters", lambda self, rng: None)
        mp.setattr(nn.init, "kaiming_uniform", lambda rng, shape, *a, dtype=np.float32, **k: np.zeros(shape, dtype))
        mp.setattr(nn.init, "bias_uniform", lambda rng, shape, n, dtype=np.float32, **k: np.zeros((n,), dtype))
        for name in ("normal_", "trunc_normal_", "kaiming_normal_"):
            mp.setattr(models._init, name, lambda *a, **k: None)
        yield


def build(name, **kwargs):
    with cheap_weights():
        return models.get(name, **kwargs)


def layout(net):
    """The ordered (state_dict key, shape) list."""
    return [(k, tuple(v.shape)) for k, v in net.state_dict().items()]


def layout_digest(pairs):
    """As scripts/record_torchvision_specs.py: SHA-256 of compact JSON [[key, [dims...]], ...]."""
    text = json.dumps([[k, [int(d) for d in shape]] for k, shape in pairs], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def output_shape(net, input_shape):
    return trace(net, input_shape).outputs[0].shape


# ---------------------------------------------------------------- every registered model

@pytest.mark.parametrize("name", models.names())
def test_traces_at_default_input(name):
    c, h, w = models.default_input(name)
    k = models.default_num_classes(name)
    expected = (2, k, h, w) if name == "unet" else (2, k)
    assert output_shape(build(name), (2, c, h, w)) == expected


def test_registry_lists_and_exports_every_factory():
    names = models.names()
    for name in ["lenet5", "alexnet", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19",
                 "vgg19_bn", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet18_cifar",
                 "resnet20", "resnet56", "resnet110", "resnet_cifar", "resnet_deep", "googlenet", "densenet121",
                 "densenet169", "densenet_small", "unet"]:
        assert name in names
    for name in names:
        assert getattr(models, name) is models.info(name).factory
    assert set(SPECS) <= set(names)
    assert models.default_input("resnet18") == (3, 224, 224)
    assert models.default_input("lenet5") == (1, 28, 28)
    assert models.default_input("resnet20") == (3, 32, 32)
    assert models.default_num_classes("resnet20") == 10


def test_registry_unknown_name_suggests_close_ones():
    with pytest.raises(ValueError, match="resnet50") as excinfo:
        models.get("resnet5")
    assert "resnet5'" in str(excinfo.value)
    with pytest.raises(ValueError, match="unknown model"):
        models.default_input("no-such-net")


def test_registry_passes_keyword_arguments():
    assert output_shape(build("vgg16", num_classes=10), (1, 3, 224, 224)) == (1, 10)
    assert models.get("resnet_cifar", depth=8).layer1.__len__() == 1


# ---------------------------------------------------------------- torchvision layouts

@pytest.mark.parametrize("name", sorted(SPECS))
def test_layout_matches_torchvision(name):
    spec = SPECS[name]
    net = build(name)
    assert sum(p.data.size for p in net.parameters()) == spec["num_params"]
    assert len(net.state_dict()) == spec["num_entries"]
    if spec.get("sha256"):
        assert layout_digest(layout(net)) == spec["sha256"], "state_dict keys, order or shapes differ"


@pytest.mark.skipif(tv_models is None, reason="torchvision is not importable")
@pytest.mark.parametrize("name", sorted(SPECS))
def test_layout_equals_torchvision_directly(name):
    kwargs = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
    with torch.device("meta"):
        ref = getattr(tv_models, name)(weights=None, **kwargs)
    assert layout(build(name)) == [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    assert build(name).num_parameters() == sum(p.numel() for p in ref.parameters())


def test_torchvision_key_names():
    sd = build("resnet18").state_dict()
    assert sd["conv1.weight"].shape == (64, 3, 7, 7)
    for key in ["layer1.0.conv1.weight", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
                "layer4.1.bn2.bias", "fc.weight"]:
        assert key in sd
    assert "layer1.0.downsample.0.weight" not in sd
    assert "layer1.0.downsample.0.weight" in build("resnet50").state_dict()  # 64 -> 256 channels
    sd = build("densenet121").state_dict()
    for key in ["features.conv0.weight", "features.denseblock1.denselayer1.norm1.running_mean",
                "features.denseblock4.denselayer16.conv2.weight", "features.transition1.conv.weight",
                "features.norm5.weight", "classifier.bias"]:
        assert key in sd
    sd = build("googlenet").state_dict()
    for key in ["conv1.conv.weight", "conv1.bn.running_mean", "inception3a.branch1.conv.weight",
                "inception3a.branch2.1.conv.weight", "inception5b.branch4.1.bn.weight", "fc.bias"]:
        assert key in sd
    assert sd["inception3a.branch3.1.conv.weight"].shape == (32, 16, 3, 3)  # torchvision's 3x3, not 5x5
    assert list(build("alexnet").state_dict())[-1] == "classifier.6.bias"
    sd = build("vgg16_bn").state_dict()
    assert "features.1.running_var" in sd and "classifier.6.weight" in sd


def test_batchnorm_step_counter_is_a_scalar():
    assert nn.BatchNorm2d(4).state_dict()["num_batches_tracked"].shape == ()


# ---------------------------------------------------------------- AlexNet, VGG, GoogLeNet

def test_alexnet_takes_other_input_sizes():
    net = build("alexnet")
    with pytest.raises(ShapeError, match=r"features\.\d+"):
        trace(net, (1, 3, 32, 32))
    for size in (96, 256, 227):  # 2x2, 7x7 and 6x6 features, pooled adaptively to 6x6 as in torchvision
        assert output_shape(net, (1, 3, size, size)) == (1, 1000)
    ops = [n.op.name for n in trace(net, (1, 3, 224, 224)).nodes]
    assert "adaptive_avg_pool2d" not in ops  # at 224 the features are 6x6 already: the pool is the identity


def test_vgg_other_image_sizes():
    net = build("vgg16", num_classes=10, image_size=32)
    assert net.state_dict()["classifier.0.weight"].shape == (4096, 512)
    assert [k for k, _ in layout(net)] == [k for k, _ in layout(build("vgg16"))]
    assert output_shape(net, (2, 3, 32, 32)) == (2, 10)
    assert output_shape(net, (1, 3, 64, 64)) == (1, 10)           # 2x2 features pooled to 1x1
    assert output_shape(build("vgg11_bn"), (1, 3, 64, 64)) == (1, 1000)   # 2x2 spread over 7x7, as torchvision
    assert output_shape(build("vgg11", image_size=64), (1, 3, 96, 96)) == (1, 1000)
    with pytest.raises(ShapeError, match=r"features\.\d+"):
        trace(net, (1, 3, 16, 16))


def test_googlenet_feature_map_sizes_match_torchvision_at_224():
    g = trace(build("googlenet"), (1, 3, 224, 224))
    sizes = {n.path: n.outputs[0].shape[2:] for n in g.nodes if n.path.startswith("maxpool")}
    # torchvision's ceil_mode pools give 56, 28, 14 and 7; padding=1 gives the same at even sizes.
    assert sizes == {"maxpool1": (56, 56), "maxpool2": (28, 28), "maxpool3": (14, 14), "maxpool4": (7, 7)}
    with pytest.raises(ValueError, match="aux"):
        models.googlenet(aux_logits=True)


# ---------------------------------------------------------------- ResNets

def test_resnet_cifar_parameter_counts():
    # Option-B shortcuts: 272,474 for ResNet-20, and each extra block per stage (16+32+64 channels) adds
    # 4,672 + 18,560 + 73,984 = 97,216 parameters.
    for depth in (20, 32, 44, 56, 110):
        n = (depth - 2) // 6
        assert build(f"resnet{depth}").num_parameters() == 272_474 + 97_216 * (n - 3)
    assert models.resnet_cifar(20).num_parameters() == 272_474
    assert models.resnet_cifar(26, num_classes=100).fc.weight.shape == (100, 64)
    for bad in (19, 21, 2):
        with pytest.raises(ValueError, match="6n"):
            models.resnet_cifar(bad)


def test_resnet18_cifar_has_resnet18_keys():
    small, big = layout(build("resnet18_cifar")), layout(build("resnet18"))
    assert [k for k, _ in small] == [k for k, _ in big]
    differ = {k for (k, s), (_, t) in zip(small, big) if s != t}
    assert differ == {"conv1.weight", "fc.weight", "fc.bias"}
    assert dict(small)["conv1.weight"] == (64, 3, 3, 3)
    assert build("resnet18_cifar").num_parameters() == 11_173_962
    g = trace(build("resnet18_cifar"), (2, 3, 32, 32))
    assert not any(n.op.name == "max_pool2d" for n in g.nodes)


def test_resnet_deep_layout_rule():
    assert models.deep_layers(50) == [3, 4, 6, 3]
    assert models.deep_layers(101) == [3, 4, 23, 3]
    assert models.deep_layers(152) == [3, 8, 36, 3]
    assert models.deep_layers(200) == [3, 24, 36, 3]
    assert models.deep_layers(1001) == [3, 131, 196, 3]
    for depth in (26, 29, 104, 500, 1001):
        assert 3 * sum(models.deep_layers(depth)) + 2 == depth
    for bad in (23, 51, 1000):
        with pytest.raises(ValueError, match="3 \\* blocks \\+ 2"):
            models.deep_layers(bad)
    assert layout(build("resnet_deep", depth=152)) == layout(build("resnet152"))


def test_resnet_deep_1001_traces_quickly():
    start = time.perf_counter()
    net = build("resnet_deep", depth=1001)
    g = trace(net, (1, 3, 224, 224))
    elapsed = time.perf_counter() - start
    assert g.outputs[0].shape == (1, 1000)
    weighted = [n for n in g.nodes if n.op.name in ("conv2d", "linear") and "downsample" not in n.path]
    assert len(weighted) == 1001
    assert elapsed < 10, f"building and tracing ResNet-1001 took {elapsed:.1f} s"


def test_resnet_init_and_zero_init_residual():
    net = models.resnet20()
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    for conv in convs[-3:]:  # the largest: 64x64x3x3 = 36,864 weights
        o, _, kh, kw = conv.weight.shape
        assert conv.weight.data.std() == pytest.approx(np.sqrt(2.0 / (o * kh * kw)), rel=0.05)
    assert all(np.all(m.weight.data == 1) and np.all(m.bias.data == 0)
               for m in net.modules() if isinstance(m, nn.BatchNorm2d))
    net = models.resnet20(zero_init_residual=True)
    assert np.all(net.layer2[1].bn2.weight.data == 0) and np.all(net.layer2[1].bn1.weight.data == 1)
    deep = models.ResNet(models.Bottleneck, [1, 1], widths=(8, 16), stem="cifar", zero_init_residual=True)
    assert np.all(deep.layer1[0].bn3.weight.data == 0) and np.all(deep.layer1[0].bn2.weight.data == 1)
    assert output_shape(deep, (2, 3, 16, 16)) == (2, 1000)


def test_densenet_and_googlenet_init():
    net = models.densenet_small()
    conv = net.features.denseblock2.denselayer2.conv2.weight.data  # 12 x 48 x 3 x 3, fan_in 432
    assert conv.std() == pytest.approx(np.sqrt(2.0 / 432), rel=0.1)
    assert np.all(net.classifier.bias.data == 0)
    net = models.googlenet()
    w = net.inception4e.branch2[1].conv.weight.data
    assert w.std() == pytest.approx(0.01, rel=0.05) and np.abs(w).max() <= 2


# ---------------------------------------------------------------- LeNet, DenseNet, U-Net

def test_lenet5():
    for size in (28, 32):
        net = models.lenet5(image_size=size)
        assert net.num_parameters() == 61_706
        assert output_shape(net, (4, 1, size, size)) == (4, 10)
    with pytest.raises(ShapeError, match="classifier.0"):
        trace(models.lenet5(image_size=28), (1, 1, 32, 32))
    assert output_shape(models.lenet5(num_classes=5, in_channels=3, image_size=32), (1, 3, 32, 32)) == (1, 5)


def test_densenet_small():
    net = models.densenet_small(num_classes=7)
    assert "features.pool0" not in {p for p, _ in net.named_modules()}
    assert "features.transition2.conv.weight" in net.state_dict()
    assert "features.transition3.conv.weight" not in net.state_dict()
    assert output_shape(net, (3, 3, 32, 32)) == (3, 7)
    g = trace(net, (1, 3, 32, 32))
    cats = [n for n in g.nodes if n.op.name == "cat"]
    # Per block: layer 1 reads x alone (no cat), layer 2 cat([x, f1]), the block output cat([x, f1, f2]).
    assert len(cats) == 3 * 2


def test_unet():
    net = models.unet(in_channels=1, num_classes=2, base=4, depth=2, batch_norm=False)
    assert net.num_parameters() == 7402  # counted by hand in the module's terms (see below)
    # encoder 188 + 880, bottleneck 3488, up 520 + 132, decoder 1744 + 440, head 10
    assert output_shape(net, (2, 1, 32, 48)) == (2, 2, 32, 48)
    with pytest.raises(ShapeError, match="divisible"):
        trace(net, (1, 1, 30, 32))
    sd = net.state_dict()
    assert {"encoder.0.0.weight", "bottleneck.2.bias", "upconvs.0.weight", "decoder.1.2.weight",
            "head.weight"} <= set(sd)
    assert sd["upconvs.0.weight"].shape == (16, 8, 2, 2)
    bn = models.unet(base=8, depth=3)
    assert "encoder.0.1.running_mean" in bn.state_dict() and "encoder.0.0.bias" not in bn.state_dict()
    assert output_shape(bn, (1, 3, 64, 64)) == (1, 2, 64, 64)
