"""Convolution algorithms of the CPU backend on ResNet-18 and VGG-16 layer shapes.

For every distinct convolution of each network: the median time (of --repeats
runs, after one warm-up) and the workspace of each algorithm for the forward,
backward-data and backward-filter passes, PyTorch's time for reference, and
the algorithm a workspace selector would pick (the fastest whose workspace
fits) under a loose (unlimited), a tight (--tight of the network's largest
default workspace) and a zero budget. A backward pair is timed as the sum of
its halves.

PyTorch runs as its users run it: in a process of its own (scripts/peers.py),
with the environment less what ``import minidnn`` sets, at its default thread
count; each layer is timed by minidnn, then by PyTorch, so the machine's noise
falls on both. It is timed at its defaults (the per-layer columns) and with each
``--peer-env`` (default ``OMP_WAIT_POLICY=PASSIVE``, its likely best); the
whole-network lines compare minidnn with the faster.

    python scripts/bench_conv_cpu.py                 # ~2 minutes on 2 cores
    python scripts/bench_conv_cpu.py --quick         # smaller batches, seconds
    python scripts/bench_conv_cpu.py --json out.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types

import peers  # stdlib only
from peers import median_time

STARTED_WITH = dict(os.environ)   # before minidnn adds its settings: shown beside what it ran with
import minidnn  # noqa: F401  before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np

import minidnn._C as K
from minidnn.graph import Spec
from minidnn.ops import conv_algos
from minidnn.ops.conv import Conv2dOp
from minidnn.schedule import ALIGN
from minidnn.backend.lanes import Lanes

CONV = conv_algos.Convolutions(Lanes(K))   # runs the lane variants, as the CPU backend does

MiB = 1 << 20


def resnet18(n, size):
    """(name, count, N, C, H, O, k, stride, pad) of torchvision's ResNet-18 (or the CIFAR stem)."""
    out = []
    if size >= 64:
        out.append(("conv1 7x7/2", 1, n, 3, size, 64, 7, 2, 3))
        h = size // 4
    else:
        out.append(("conv1 3x3", 1, n, 3, size, 64, 3, 1, 1))
        h = size
    c = 64
    for i, width in enumerate((64, 128, 256, 512)):
        if i:
            out.append((f"layer{i + 1}.0.conv1 3x3/2", 1, n, c, h, width, 3, 2, 1))
            out.append((f"layer{i + 1}.0.down 1x1/2", 1, n, c, h, width, 1, 2, 0))
            h //= 2
            out.append((f"layer{i + 1} 3x3", 3, n, width, h, width, 3, 1, 1))
        else:
            out.append(("layer1 3x3", 4, n, c, h, width, 3, 1, 1))
        c = width
    return out


def vgg16(n, size):
    out, c, h = [], 3, size
    for stage, (width, reps) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))):
        out.append((f"s{stage + 1} {c}->{width}", 1, n, c, h, width, 3, 1, 1))
        if reps > 1:
            out.append((f"s{stage + 1} {width}->{width}", reps - 1, n, width, h, width, 3, 1, 1))
        c, h = width, h // 2
    return out


def columns(n, lanes):
    return (["im2col"] + [f"im2col_chunk{k}" for k in conv_algos.chunk_sizes(n)]
            + [f"im2col_chunk{k}x{lanes}" for k in conv_algos.lane_chunk_sizes(n, lanes)]
            + ["direct", "gemm1x1"] + list(conv_algos.WINOGRAD) + ["implicit"])


def short(name):
    """A column's heading: chunk16 for im2col_chunk16, wino2x2 and wino4x4 for Winograd."""
    if name in conv_algos.WINOGRAD:
        m = conv_algos.WINOGRAD[name]
        return f"wino{m}x{m}"
    return name[len("im2col_"):] if name.startswith("im2col_chunk") else name


def aligned(nbytes, align=ALIGN):
    """A byte buffer aligned as the executor's arena places workspaces."""
    raw = np.empty(nbytes + align, np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip:skip + nbytes]


def bench_layer(spec, repeats, torch, gap=0.2):
    """``torch``: [(label, peers.Worker)] of PyTorch's processes, its defaults first."""
    name, count, n, c, h, o, k, s, p = spec
    op = Conv2dOp(s, p)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, h), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32) * 0.1
    xs, ws_ = Spec(x.shape, x.dtype), Spec(w.shape, w.dtype)
    (ys,) = op.infer(xs, ws_)
    y = np.empty(ys.shape, np.float32)
    gy = rng.standard_normal(ys.shape, dtype=np.float32)
    gx, gw = np.empty_like(x), np.empty_like(w)
    g = conv_algos.Geom.of(op, xs, ws_, ys)
    fwd = {a.name: a for a in CONV.algorithms(op, [xs, ws_], [ys], "forward")}
    bwd = {a.name: a for a in CONV.algorithms(op, [xs, ws_], [ys], "backward")}
    res = {"layer": name, "count": count, "shape": [n, c, h, h, o, k, s, p], "out": list(ys.shape),
           "forward": {}, "data": {}, "filter": {}, "ws_forward": {}, "ws_data": {}, "ws_filter": {},
           "backward_pairs": {}}
    big = aligned(max(a.workspace for a in list(fwd.values()) + list(bwd.values())))

    def ctx(a):
        return types.SimpleNamespace(k=K, rng=None, recompute=False, algo=a, conv=CONV)

    for a in fwd.values():
        res["forward"][a.name] = median_time(lambda: op.forward(ctx(a.name), [x, w], [y], big[:a.workspace]), repeats)
        res["ws_forward"][a.name] = a.workspace
    data_parts = {conv_algos.split(nm, "backward")[0] for nm in bwd}
    filt_parts = {conv_algos.split(nm, "backward")[1] for nm in bwd}
    for d in sorted(data_parts):
        res["ws_data"][d] = conv_algos.part_workspace(g, d, "data")
        res["data"][d] = median_time(
            lambda: op.backward(ctx(f"{d}/im2col"), [x, w], [None], [gy], [gx, None], big), repeats)
    for f in sorted(filt_parts):
        res["ws_filter"][f] = conv_algos.part_workspace(g, f, "filter")
        res["filter"][f] = median_time(
            lambda: op.backward(ctx(f"im2col/{f}"), [x, w], [None], [gy], [None, gw], big), repeats)
    for nm, a in bwd.items():
        d, f = conv_algos.split(nm, "backward")
        res["backward_pairs"][nm] = (res["data"][d] + res["filter"][f], a.workspace)
    if torch:
        res["torch_settings"] = {}
        for label, worker in torch:
            time.sleep(gap)      # the previous side's threads stop spinning
            t = worker.request(layer=[n, c, h, o, k, s, p], repeats=repeats)
            res["torch_settings"][label] = dict(t, backward=t["data"] + t["filter"])
        for key, t in res["torch_settings"][torch[0][0]].items():     # the columns: PyTorch at its defaults
            res["torch_" + key] = t
    return res


def pick(options, limit):
    """Fastest (seconds, workspace, name) whose workspace fits ``limit`` (None: no limit)."""
    fit = [(t, ws, nm) for nm, (t, ws) in options.items() if limit is None or ws <= limit]
    return min(fit) if fit else None


def fmt_ms(t):
    return "-" if t is None else (f"{t * 1e3:7.1f}" if t < 10 else f"{t:6.1f}s")


def report(net, results, tight_frac, torch):
    n = results[0]["shape"][0]
    cols = columns(n, conv_algos.default_lanes())
    heads = [short(c) for c in cols]
    width = max(len(r["layer"]) for r in results) + 5
    print(f"\n=== {net}: time per layer call (ms, median); x<k> = layers of that shape ===")
    for pass_, key in (("forward", "forward"), ("backward-data", "data"), ("backward-filter", "filter")):
        torch_head = "    torch" if torch else ""
        print(f"\n{pass_:<{width}}" + "".join(f"{h:>10}" for h in heads) + torch_head)
        for r in results:
            row = f"{r['layer'] + ' x' + str(r['count']):<{width}}"
            row += "".join(f"{fmt_ms(r[key].get(c)):>10}" for c in cols)
            if torch and key == "forward":
                row += f"{fmt_ms(r['torch_forward']):>10}"
            if torch and key in ("data", "filter"):
                row += f"{fmt_ms(r['torch_' + key]):>10}"
            print(row)
    print(f"\n{'workspace (MiB) fwd / bwd pair':<{width}}" + "".join(f"{h:>10}" for h in heads))
    for r in results:
        cells = []
        for c in cols:
            if c not in r["ws_forward"]:
                cells.append("-")
                continue
            pair = r["backward_pairs"].get(c)
            fwd = f"{r['ws_forward'][c] / MiB:.0f}"
            cells.append(f"{fwd}/{pair[1] / MiB:.0f}" if pair else fwd)
        print(f"{r['layer']:<{width}}" + "".join(f"{x:>10}" for x in cells))

    # the selector: fastest algorithm whose workspace fits, per pass
    biggest = max(max(r["ws_forward"]["im2col"], r["backward_pairs"]["im2col"][1]) for r in results)
    budgets = [("loose (unlimited)", None), (f"tight ({tight_frac:.0%} of {biggest / MiB:.0f} MiB)",
                                              int(biggest * tight_frac)), ("zero", 0)]
    print(f"\nselected algorithm (fastest that fits) per layer: forward | backward (data/filter)")
    totals = {}
    default_total = sum(r["count"] * (r["forward"]["im2col"] + r["backward_pairs"]["im2col"][0]) for r in results)
    for label, limit in budgets:
        print(f"  budget {label}:")
        tot = 0.0
        for r in results:
            f = pick({nm: (t, r["ws_forward"][nm]) for nm, t in r["forward"].items()}, limit)
            b = pick(r["backward_pairs"], limit)
            tot += r["count"] * (f[0] + b[0])
            print(f"    {r['layer']:<{width - 4}} {short(f[2]):>10} {fmt_ms(f[0])} ms {f[1] / MiB:6.1f} MiB | "
                  f"{b[2]:<24} {fmt_ms(b[0])} ms {b[1] / MiB:6.1f} MiB")
        totals[label] = tot
    print(f"\n  whole network (sum over layers x count, forward + backward):")
    print(f"    default im2col        {default_total * 1e3:9.1f} ms")
    for label, tot in totals.items():
        print(f"    selected, {label:<22} {tot * 1e3:9.1f} ms  ({tot / default_total:.2f}x default)")
    if torch:
        peer = {}
        for label, _ in torch:
            peer[label] = sum(r["count"] * (r["torch_settings"][label]["forward"]
                                            + r["torch_settings"][label]["backward"]) for r in results)
            print(f"    torch, {label:<25} {peer[label] * 1e3:9.1f} ms  ({peer[label] / default_total:.2f}x default)")
        loose = totals[budgets[0][0]]
        print(f"    selected loose / torch's faster: {loose / min(peer.values()):.2f}"
              f"  (/ torch at its defaults: {loose / peer[torch[0][0]]:.2f})")
        totals["torch"] = peer
    # which algorithm wins where
    wins = {}
    for r in results:
        for key in ("forward", "data", "filter"):
            best = min(r[key], key=r[key].get)
            wins.setdefault(key, []).append(f"{r['layer'].split()[0]}:{short(best)}")
    for key, v in wins.items():
        print(f"  fastest {key:<8}: " + ", ".join(v))
    return {"default": default_total, **totals}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default="resnet18,resnet18_cifar,vgg16",
                    help="comma-separated subset of resnet18, resnet18_cifar, vgg16")
    ap.add_argument("--resnet", default="8x224", help="ResNet-18 batch x image size (default 8x224)")
    ap.add_argument("--cifar", default="32x32", help="CIFAR ResNet-18 batch x image size (default 32x32)")
    ap.add_argument("--vgg", default="2x112",
                    help="VGG-16 batch x image size (default 2x112: 1/8 of the work of 4x224, same layer shapes "
                         "at half the resolution; 4x224 takes ~8 minutes on 2 cores)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tight", type=float, default=0.10, help="tight budget, fraction of the largest default workspace")
    ap.add_argument("--quick", action="store_true", help="batch 2 everywhere, VGG at 56: a smoke run")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--peer-env", action="append", metavar="NAME=VALUE[,...]",
                    help="also time PyTorch with these settings (repeatable; default OMP_WAIT_POLICY=PASSIVE; "
                         "'' for its defaults only)")
    ap.add_argument("--json", help="write the raw timings here")
    a = ap.parse_args(argv)
    torch = []
    if not a.no_torch and importlib.util.find_spec("torch"):
        envs = [{}] + [peers.settings(v) for v in (a.peer_env if a.peer_env is not None else peers.DEFAULT_BEST) if v]
        torch = [(peers.label(env), peers.Worker(f"PyTorch ({peers.label(env)})", ["conv"], env)) for env in envs]
    if a.quick:
        a.resnet, a.cifar, a.vgg = "2x64", "4x32", "1x56"
    sizes = {"resnet18": a.resnet, "resnet18_cifar": a.cifar, "vgg16": a.vgg}
    print(f"minidnn conv algorithms on {peers.machine()}; {K.get_num_threads()} threads; float32; "
          f"median of {a.repeats}; load average {peers.load()} at the start; each side ran with:")
    print(peers.side_text("minidnn", peers.describe(), STARTED_WITH, "import minidnn"))
    for _, w in torch:
        print(peers.side_text(w.name, w.info, w.env))
    t0 = time.perf_counter()
    out = {}
    for net in a.nets.split(","):
        n, size = (int(v) for v in sizes[net].split("x"))
        layers = vgg16(n, size) if net == "vgg16" else resnet18(n, size)
        results = []
        for spec in layers:
            results.append(bench_layer(spec, a.repeats, torch))
            print(f"  {net} {spec[0]}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        totals = report(f"{net} batch {n} at {size}x{size}", results, a.tight, torch)
        out[net] = {"batch": n, "size": size, "layers": results, "totals": totals}
    for _, w in torch:
        w.close()
    print(f"\ntotal bench time {time.perf_counter() - t0:.0f} s; load average {peers.load()} at the end")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
