"""The benchmarks' peer plumbing (scripts/peers.py): PyTorch's process starts without what
``import minidnn`` sets in the environment, and never imports minidnn. No timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
sys.path.insert(0, SCRIPTS)
import peers  # noqa: E402


def python(code, env):
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=SCRIPTS, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_minidnn_sets_nothing_the_peer_environment_keeps():
    added = python("import json, os; before = dict(os.environ); import minidnn; "
                   "print(json.dumps(sorted(k for k in os.environ if os.environ[k] != before.get(k))))",
                   peers.environment())
    assert added and set(added) <= set(peers.MINIDNN_SETS)


def test_peer_environment_lacks_minidnn_settings_after_import():
    assert os.environ.get("OMP_WAIT_POLICY")        # conftest imported minidnn: it set them here
    env = peers.environment()
    assert not set(peers.MINIDNN_SETS) & set(env)
    assert peers.environment({"OMP_WAIT_POLICY": "PASSIVE"})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert peers.settings("OMP_WAIT_POLICY=PASSIVE, X=1") == {"OMP_WAIT_POLICY": "PASSIVE", "X": "1"}
    assert peers.settings("") == {}


def test_importing_peers_loads_no_framework():
    loaded = python("import json, sys, peers; print(json.dumps([m for m in ('minidnn', 'numpy', 'torch') "
                    "if m in sys.modules]))", peers.environment())
    assert loaded == []


def test_alternate_rotates_the_first_side():
    order = []
    sides = [lambda i=i: order.append(i) or 0.001 * (i + 1) for i in range(3)]
    times, timed, busy, _ = peers.alternate(sides, steps=2, warmup=1, gap=0)
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert times == [[0.001] * 2, [0.002] * 2, [0.003] * 2] and (timed, busy) == (2, 0)


def test_alternate_runs_a_busy_round_again(monkeypatch):
    shares = iter([0.0, 0.9, 0.0, 0.0])      # the second round's step: other processes took 90% of the CPU
    monkeypatch.setattr(peers, "others_share", lambda before, after: next(shares))
    steps = iter([0.1, 0.5, 0.2, 0.3])
    times, timed, busy, worst = peers.alternate([lambda: next(steps)], steps=2, warmup=1, gap=0, busy=0.1)
    assert times == [[0.2, 0.3]] and (timed, busy, worst) == (3, 1, 0.0)
    shares = iter([0.9] * 5)                  # never quiet: every round is kept
    steps = iter([0.1, 0.2, 0.3, 0.4, 0.5])
    times, timed, busy, worst = peers.alternate([lambda: next(steps)], steps=2, warmup=1, gap=0, busy=0.1,
                                                max_rounds=4)
    assert times == [[0.2, 0.3, 0.4, 0.5]] and (timed, busy, worst) == (4, 4, 0.9)


def test_a_process_spinning_beside_ours_counts_as_others():
    before = peers.cpu_snapshot([os.getpid()])
    if before is None:
        pytest.skip("no /proc")
    spin = "import time\nt = time.time()\nwhile time.time() - t < 0.5: pass"
    others = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
    for p in others:
        p.wait()
    assert peers.others_share(before, peers.cpu_snapshot([os.getpid()])) > 0.3


def test_torch_worker_runs_at_its_defaults_without_minidnn():
    pytest.importorskip("torch")
    for extra, policy in (({}, None), ({"OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE")):
        w = peers.Worker("PyTorch", ["conv"], extra)
        try:
            assert w.info["minidnn"] is None and w.info["torch"]["threads"] >= 1
            assert w.info["env"]["OMP_WAIT_POLICY"] == policy and w.info["env"]["OPENBLAS_THREAD_TIMEOUT"] is None
            t = w.request(layer=[1, 2, 4, 3, 3, 1, 1], repeats=1)
            assert set(t) == {"forward", "data", "filter"} and all(v > 0 for v in t.values())
        finally:
            w.close()
