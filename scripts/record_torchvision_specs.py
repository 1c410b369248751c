#!/usr/bin/env python
"""Record torchvision's parameter counts and state_dict layouts for tests/test_models.py.

For each model that minidnn.models reproduces, this writes to
tests/fixtures/torchvision_specs.json:

* ``num_params``: ``sum(p.numel() for p in model.parameters())``;
* ``num_entries``: the number of state_dict entries (parameters and buffers);
* ``sha256``: SHA-256 of the ordered (key, shape) list, see :func:`layout_digest`.

The test compares minidnn's models against these numbers, so torchvision is not
needed to run the tests. Run it where torch and torchvision are installed:

    python scripts/record_torchvision_specs.py

If torchvision's wheel was built for another torch (its ``import`` then fails
while registering its C++ operators), point ``--torchvision-source`` at an
unpacked wheel (the folder holding ``torchvision/``); the model definitions,
which are plain Python, are then imported without running
``torchvision/__init__.py``:

    pip download torchvision --no-deps -d /tmp/tv && python -m zipfile -e /tmp/tv/torchvision-*.whl /tmp/tv/src
    python scripts/record_torchvision_specs.py --torchvision-source /tmp/tv/src

The models are built on torch's "meta" device: no memory, no initialization.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import types

# minidnn name -> (torchvision module, builder, keyword arguments).
MODELS = {
    "alexnet": ("alexnet", "alexnet", {}),
    "vgg11": ("vgg", "vgg11", {}),
    "vgg11_bn": ("vgg", "vgg11_bn", {}),
    "vgg13": ("vgg", "vgg13", {}),
    "vgg13_bn": ("vgg", "vgg13_bn", {}),
    "vgg16": ("vgg", "vgg16", {}),
    "vgg16_bn": ("vgg", "vgg16_bn", {}),
    "vgg19": ("vgg", "vgg19", {}),
    "vgg19_bn": ("vgg", "vgg19_bn", {}),
    "resnet18": ("resnet", "resnet18", {}),
    "resnet34": ("resnet", "resnet34", {}),
    "resnet50": ("resnet", "resnet50", {}),
    "resnet101": ("resnet", "resnet101", {}),
    "resnet152": ("resnet", "resnet152", {}),
    # minidnn's GoogLeNet has no auxiliary heads (torchvision drops them too when loading weights).
    "googlenet": ("googlenet", "googlenet", {"aux_logits": False, "init_weights": False}),
    "densenet121": ("densenet", "densenet121", {}),
    "densenet161": ("densenet", "densenet161", {}),
    "densenet169": ("densenet", "densenet169", {}),
    "densenet201": ("densenet", "densenet201", {}),
}

DEFAULT_OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "fixtures",
                              "torchvision_specs.json")


def layout_digest(pairs):
    """SHA-256 (hex) of a state_dict layout: ``pairs`` is the ordered list of (key, shape).

    The digest is over the compact JSON ``[["conv1.weight",[64,3,7,7]],...]``
    (UTF-8), scalars having shape ``[]``. tests/test_models.py computes the same.
    """
    text = json.dumps([[k, [int(d) for d in shape]] for k, shape in pairs], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def torchvision_module(module, source=None):
    """``torchvision.models.<module>``, optionally from an unpacked wheel without its package __init__."""
    if source:
        root = os.path.join(os.path.abspath(source), "torchvision")
        if not os.path.isdir(os.path.join(root, "models")):
            raise SystemExit(f"{source}: no torchvision/models folder there")
        for name, path in (("torchvision", root), ("torchvision.models", os.path.join(root, "models"))):
            if name not in sys.modules:
                pkg = types.ModuleType(name)
                pkg.__path__ = [path]
                sys.modules[name] = pkg
    return importlib.import_module(f"torchvision.models.{module}")


def torchvision_version(source=None):
    if source:
        for entry in sorted(os.listdir(source)):
            if entry.startswith("torchvision-") and entry.endswith(".dist-info"):
                return entry[len("torchvision-"):-len(".dist-info")]
        return "unknown"
    import torchvision
    return torchvision.__version__


def record(name, source=None):
    import torch

    module, builder, kwargs = MODELS[name]
    with torch.device("meta"):
        model = getattr(torchvision_module(module, source), builder)(weights=None, **kwargs)
    sd = model.state_dict()
    return {
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_entries": len(sd),
        "sha256": layout_digest((k, tuple(v.shape)) for k, v in sd.items()),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchvision-source", metavar="DIR",
                        help="an unpacked torchvision wheel, imported without its package __init__")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="the JSON file to write (default: %(default)s)")
    parser.add_argument("models", nargs="*", help="the models to record (default: all)")
    args = parser.parse_args(argv)

    import torch

    names = args.models or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    specs = {}
    for name in names:
        specs[name] = record(name, args.torchvision_source)
        print(f"{name:12s} {specs[name]['num_params']:>12,d} parameters, {specs[name]['num_entries']} entries")
    out = {
        "description": "torchvision model layouts: num_params = sum(p.numel() for p in model.parameters()); "
                       "sha256 over the ordered (state_dict key, shape) list as compact JSON "
                       "[[key, [dims...]], ...]; written by scripts/record_torchvision_specs.py",
        "torchvision_version": torchvision_version(args.torchvision_source),
        "torch_version": torch.__version__,
        "models": specs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"wrote {os.path.normpath(args.output)}")


if __name__ == "__main__":
    main()
