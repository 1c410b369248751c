"""PyTorch as its users run it: in a process of its own, with its own defaults, its turns
alternated with minidnn's.

``import minidnn`` sets ``OMP_WAIT_POLICY`` and ``OPENBLAS_THREAD_TIMEOUT`` in the environment
(minidnn/__init__.py), and PyTorch's OpenMP runtime reads the policy when it loads: timed in
minidnn's process, the peer runs under minidnn's settings, not its own. So the benchmarks start
the peer as a worker process (``Worker``) with the environment less minidnn's settings
(``environment``), which imports PyTorch first and never minidnn, and hand out the turns
(``alternate``) so that the machine's noise falls on every side alike. Each side reports the
environment and threads it ran with (``describe``). Stdlib only at import: a process that
imports this module still chooses which of NumPy, PyTorch or minidnn loads first.

The workers (run by the benchmarks, not by hand):

    python scripts/peers.py step --model resnet18_cifar --share FILE.npz   # a training step
    python scripts/peers.py conv                                           # one convolution's passes
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# What ``import minidnn`` sets where the environment does not (tests/test_bench_peers.py checks
# that this is all of it): the peer's default environment goes without them.
MINIDNN_SETS = ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")
# The variables shown for each side: what decides how its threads run and wait.
SHOWN = MINIDNN_SETS + ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_BEST = ("OMP_WAIT_POLICY=PASSIVE",)   # the peer's candidate best setting, measured beside its default
PREFIX = "@peer "                              # a protocol line; anything else a worker prints is passed on


def settings(text):
    """{"NAME": "value"} of ``"NAME=value,NAME2=value2"`` (empty: none)."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"expected NAME=value, got {item!r}")
        out[name] = value
    return out


def label(env_settings):
    return ", ".join(f"{k}={v}" for k, v in env_settings.items()) or "defaults"


def environment(extra=None, base=None):
    """``base`` (default: this process's environment) less what ``import minidnn`` sets, plus
    ``extra`` ({"NAME": "value"}): the environment a PyTorch user starts with."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in MINIDNN_SETS}
    env.update(extra or {})
    return env


def machine():
    """The CPU model, its family and model numbers, the cores, AVX-512F, the load average."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    ids = f" (family {fields['cpu family']}, model {fields['model']})" if "cpu family" in fields else ""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    avx512 = "" if not fields else ("; AVX-512F" if "avx512f" in fields.get("flags", "").split() else "; no AVX-512F")
    return f"{name}{ids}, {os.cpu_count()} cores ({usable} usable){avx512}"


def load():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def describe():
    """This process's side: the variables of SHOWN (None: unset), the BLAS and OpenMP libraries
    as threadpoolctl finds them, PyTorch's version and threads, minidnn's threads."""
    info = {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in SHOWN}, "minidnn": None, "torch": None}
    try:
        from threadpoolctl import threadpool_info
        info["pools"] = [{k: p.get(k) for k in ("user_api", "internal_api", "version", "architecture",
                                                 "num_threads", "filepath")} for p in threadpool_info()]
    except ImportError:
        info["pools"] = []
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                         "interop_threads": torch.get_num_interop_threads(), "mkl": torch.backends.mkl.is_available()}
    if "minidnn" in sys.modules:
        import minidnn._C as K
        info["minidnn"] = {"version": sys.modules["minidnn"].__version__, "threads": K.get_num_threads()}
    return info


def owner(path):
    """Whose copy of a library: 'NumPy' for .../numpy.libs/..., else the file's name."""
    folder = os.path.basename(os.path.dirname(path or ""))
    return {"numpy.libs": "NumPy", "scipy.libs": "SciPy", "lib": "torch"}.get(folder, os.path.basename(path or "?"))


def side_text(name, info, started_with=None, setter="the process"):
    """A side's threads, libraries and environment, in two lines; a variable that differs from
    ``started_with`` (the environment the process was started with) is marked as set by ``setter``."""
    parts = []
    if info.get("minidnn"):
        parts.append(f"minidnn {info['minidnn']['version']} {info['minidnn']['threads']} threads")
    if info.get("torch"):
        t = info["torch"]
        parts.append(f"PyTorch {t['version']} {t['threads']} threads ({t['interop_threads']} inter-op)"
                     + (", MKL" if t["mkl"] else ""))
    for p in info.get("pools", []):
        if p["user_api"] == "blas":
            parts.append(f"{owner(p['filepath'])}'s BLAS {p['internal_api']} {p['version']} "
                         f"kernel {p['architecture'] or '?'} {p['num_threads']} threads")
        elif p["user_api"] == "openmp":
            parts.append(f"OpenMP {os.path.basename(p['filepath'] or '?')} {p['num_threads']} threads")
    set_, unset = [], []
    for k, v in info["env"].items():
        if v is None:
            unset.append(k)
        else:
            mark = "" if started_with is None or started_with.get(k) == v else f" (set by {setter})"
            set_.append(f"{k}={v}{mark}")
    env = ", ".join(set_) or "none of them set"
    return f"  {name}: " + "; ".join(parts) + f"\n    env: {env}" + ("; unset: " + ", ".join(unset) if unset else "")


class Worker:
    """A side in a process of its own: ``python scripts/peers.py ARGS`` under ``environment(extra)``,
    answering one JSON request per line; ``info`` is what it reported when ready (``describe``)."""

    def __init__(self, name, args, extra=None):
        self.name, self.env = name, environment(extra)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + list(args), env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = self._reply()

    def _reply(self):
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                msg = json.loads(line[len(PREFIX):])
                if "error" in msg:
                    raise RuntimeError(f"{self.name}: {msg['error']}")
                return msg["result"]
            sys.stderr.write(line)
        raise RuntimeError(f"{self.name}: the worker exited with status {self.proc.wait()}")

    def request(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def step(self):
        """One timed training step, in seconds."""
        return self.request(steps=1)[0]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def serve(handle, info):
    """A worker's loop: report ``info``, then answer each request line on stdin with ``handle(request)``."""
    out, sys.stdout = sys.stdout, sys.stderr      # what the frameworks print stays out of the protocol
    out.write(PREFIX + json.dumps({"result": info}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            reply = {"result": handle(json.loads(line))}
        except Exception as e:     # the benchmark reports it and stops
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(PREFIX + json.dumps(reply) + "\n")
        out.flush()


def timed_steps(step):
    """A handler of ``{"steps": n}``: the seconds each of n calls of ``step`` took."""
    def handle(req):
        ts = []
        for _ in range(req["steps"]):
            t = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t)
        return ts
    return handle


def cpu_snapshot(pids):
    """(seconds since boot the CPUs were busy, seconds of CPU ``pids`` used, wall time), from /proc; None without it."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
        ours = 0
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ours += int(fields[11]) + int(fields[12])      # utime, stime of all its threads
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, ours / tick, time.perf_counter()


def others_share(before, after):
    """The share of the machine's CPU time that processes other than ours took between two snapshots."""
    if before is None or after is None:
        return 0.0
    wall = (after[2] - before[2]) * (os.cpu_count() or 1)
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / wall) if wall > 0 else 0.0


def alternate(sides, steps, warmup=2, gap=0.2, pids=(), busy=None, max_rounds=None):
    """The step times of each of ``sides`` (callables that run one step and return its seconds):
    ``warmup`` untimed rounds, then ``steps`` timed ones; every round runs one step of each side,
    the first side rotating from round to round, after a pause of ``gap`` seconds, so that the
    previous side's threads have stopped spinning and each side runs on a quiet machine.
    With ``busy``, a round in which processes other than ``pids`` took more than that share of
    the CPU during a step is run again, up to ``max_rounds`` timed rounds (default 3 x steps);
    where fewer than ``steps`` rounds were quiet by then, every round is kept.
    Returns (times per side, rounds timed, busy rounds, the largest share in a round kept)."""
    rounds = []                                   # (times per side, the largest share of others)
    limit = max_rounds or 3 * steps
    for r in range(warmup + limit):
        ts, shares = [None] * len(sides), [0.0]
        for i in [(r + j) % len(sides) for j in range(len(sides))]:
            time.sleep(gap)
            before = cpu_snapshot(pids) if busy is not None else None
            ts[i] = sides[i]()
            if busy is not None:
                shares.append(others_share(before, cpu_snapshot(pids)))
        if r >= warmup:
            rounds.append((ts, max(shares)))
        quiet = [x for x in rounds if busy is None or x[1] <= busy]
        if len(quiet) == steps:
            break
    kept = quiet if len(quiet) == steps else rounds
    times = [[ts[i] for ts, _ in kept] for i in range(len(sides))]
    return times, len(rounds), len(rounds) - len(quiet), max(share for _, share in kept)


def quartiles(ts):
    """(median, lower quartile, upper quartile)."""
    q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
    return statistics.median(ts), q[0], q[2]


# --- PyTorch's side (imported in the worker only) -------------------------------------------

def torch_resnet18_cifar(tnn, num_classes=10):
    class Block(tnn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.relu = tnn.ReLU()
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = tnn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(64)
            self.relu = tnn.ReLU()
            self.maxpool = tnn.Identity()
            widths, cin = (64, 128, 256, 512), 64
            for i, w in enumerate(widths):
                stride = 1 if i == 0 else 2
                setattr(self, f"layer{i + 1}", tnn.Sequential(Block(cin, w, stride), Block(w, w, 1)))
                cin = w
            self.avgpool = tnn.AdaptiveAvgPool2d((1, 1))
            self.fc = tnn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            for i in range(4):
                x = getattr(self, f"layer{i + 1}")(x)
            return self.fc(self.avgpool(x).flatten(1))

    return Net()


def torch_vgg11(tnn, num_classes=10, image_size=32):
    layers, cin = [], 3
    for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
        if v == "M":
            layers.append(tnn.MaxPool2d(2, 2))
        else:
            layers += [tnn.Conv2d(cin, v, 3, padding=1), tnn.ReLU()]
            cin = v

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.features = tnn.Sequential(*layers)
            self.avgpool = tnn.Identity()
            side = image_size // 32
            self.classifier = tnn.Sequential(tnn.Linear(512 * side * side, 4096), tnn.ReLU(), tnn.Dropout(),
                                             tnn.Linear(4096, 4096), tnn.ReLU(), tnn.Dropout(),
                                             tnn.Linear(4096, num_classes))

        def forward(self, x):
            return self.classifier(self.avgpool(self.features(x)).flatten(1))

    return Net()


TORCH_NETS = {"resnet18_cifar": torch_resnet18_cifar, "vgg11": torch_vgg11}


def step_worker(a):
    """PyTorch's SGD step on minidnn's network: the weights and the batch come from ``--share``
    (written by the minidnn side), so both train the same network on the same data; with ``--precision
    bf16`` under torch.autocast("cpu", dtype=torch.bfloat16), fp32 weights and optimizer."""
    import torch
    import numpy as np
    shared = np.load(a.share)
    net = TORCH_NETS[a.model](torch.nn)
    net.load_state_dict({k[len("state."):]: torch.from_numpy(shared[k]) for k in shared.files
                         if k.startswith("state.")})
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.from_numpy(shared["x"]), torch.from_numpy(shared["y"])

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    serve(timed_steps(step), describe())


def median_time(fn, repeats):
    """The median seconds of ``repeats`` calls of ``fn``, after one call that warms it."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def conv_worker(a):
    """PyTorch's convolution passes: ``{"layer": [n, c, h, o, k, stride, pad], "repeats": r}`` is
    answered with the median seconds of the forward, the data and the filter gradient, on the
    arrays the minidnn side draws (the same seed, in the same order)."""
    import torch
    import numpy as np

    def handle(req):
        n, c, h, o, k, s, p = req["layer"]
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, c, h, h), dtype=np.float32)
        w = rng.standard_normal((o, c, k, k), dtype=np.float32) * 0.1
        side = (h + 2 * p - k) // s + 1
        gy = rng.standard_normal((n, o, side, side), dtype=np.float32)
        xt, wt, gyt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(gy)
        out = {"forward": median_time(lambda: torch.nn.functional.conv2d(xt, wt, None, s, p), req["repeats"])}
        for key, mask in (("data", [True, False, False]), ("filter", [False, True, False])):
            out[key] = median_time(lambda: torch.ops.aten.convolution_backward(
                gyt, xt, wt, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask), req["repeats"])
        return out

    serve(handle, describe())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role", required=True)
    st = sub.add_parser("step", help="PyTorch's training step (scripts/bench_cpu.py)")
    st.add_argument("--model", choices=sorted(TORCH_NETS), required=True)
    st.add_argument("--share", required=True, help="the .npz of weights (state.*), x and y")
    st.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    sub.add_parser("conv", help="PyTorch's convolution passes (scripts/bench_conv_cpu.py)")
    a = ap.parse_args(argv)
    (step_worker if a.role == "step" else conv_worker)(a)


if __name__ == "__main__":
    main()
