"""The README runs: every Python block executes as written, each in a fresh interpreter and an empty
folder, with every warning an error (a block that provokes minidnn's own warnings teaches the wrong
order); every `minidnn` command quoted in a bash block that needs no data of the user's runs and exits 0;
every relative link points to a file of the repository."""
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
# the commands a fresh machine can run in seconds: no dataset folder of the user's, no other process
RUNNABLE = ("minidnn models", "minidnn plan", "minidnn info")


def blocks(lang):
    """(line number, text) of every ```lang block of the README."""
    text = open(README, encoding="utf-8").read()
    return [(text[:m.start()].count("\n") + 1, m.group(1))
            for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)]


def commands():
    """The README's quoted `minidnn` commands that RUNNABLE names, continuation lines joined."""
    out = []
    for line, text in blocks("bash"):
        for cmd in text.replace("\\\n", " ").splitlines():
            cmd = cmd.split("#", 1)[0].strip()
            if cmd.startswith(RUNNABLE):
                out.append(pytest.param(cmd, id=f"line{line}:{' '.join(cmd.split()[:2])}"))
    return out


def test_the_readme_has_blocks_to_run():
    assert len(blocks("python")) >= 3 and len(commands()) >= 3


@pytest.mark.parametrize("line,code", [pytest.param(*b, id=f"line{b[0]}") for b in blocks("python")])
def test_python_block_runs(line, code, tmp_path):
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert r.returncode == 0, f"README.md line {line}:\n{r.stdout[-2000:]}{r.stderr[-4000:]}"


@pytest.mark.parametrize("cmd", commands())
def test_quoted_command_runs(cmd, tmp_path):
    argv = shlex.split(cmd)
    r = subprocess.run([sys.executable, "-m", "minidnn.cli", *argv[1:]], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
    assert r.stdout.strip()


def test_relative_links_exist():
    text = open(README, encoding="utf-8").read()
    links = [m.group(1).split("#")[0] for m in re.finditer(r"\]\(([^)]+)\)", text)]
    missing = [p for p in links if p and not re.match(r"[a-z]+://", p) and not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, missing


# The planner's figures the README quotes in its prose, each beside the command that prints it: the text
# the README must contain, with {overhead} and {floor} the command's own figures (one decimal, as quoted).
QUOTED = [
    ("minidnn plan --model resnet50 --batch-size 256 --image-size 224 --budget 6GiB --profile v100-16gb",
     "ResNet-50 at batch 256 in 6 GiB on the V100 profile is {overhead} (floor {floor})"),
    ("minidnn plan --model resnet50 --batch-size 256 --image-size 224 --budget 25% --profile a100-40gb",
     "ResNet-50 at batch 256 is {overhead} on the A100 profile"),
    ("minidnn plan --model resnet50 --batch-size 256 --image-size 224 --budget 25% --profile a100-sxm4-80gb "
     "--precision tf32", "and {overhead} at 25% (floor {floor})"),
]


@pytest.mark.parametrize("cmd,quoted", QUOTED, ids=["r50-6GiB-v100", "r50-25pct-a100", "r50-25pct-a100sxm-tf32"])
def test_quoted_planner_figures_are_what_the_command_prints(cmd, quoted, tmp_path):
    import json
    text = " ".join(open(README, encoding="utf-8").read().split())
    assert f"`{cmd}`" in text, "the README no longer quotes the command"
    r = subprocess.run([sys.executable, "-m", "minidnn.cli", *shlex.split(cmd)[1:], "--json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["prediction"]
    floor = p["floor_seconds"] / p["unlimited_memory_seconds"] - 1
    expected = quoted.format(overhead=f"{p['overhead'] * 100:+.1f}%", floor=f"{floor * 100:+.1f}%")
    assert expected in text, f"README drifted: the command prints '{expected}'"
