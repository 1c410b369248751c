"""Test accuracy of ``minidnn train`` on the bundled digits in fp32 and in mixed precision, per seed.

    python scripts/digits_precision.py [--epochs 30] [--precisions fp32,bf16] [--seeds 0,1,2,3,4]

Each precision trains the default run (LeNet-5, batch 32, SGD with momentum, cosine schedule) with
each seed for the same ``--epochs`` through the command line (``minidnn train --precision P --seed
S``) into a temporary folder; the script prints each run's final test accuracy and seconds, and each
precision's median accuracy over the seeds with its difference from the reference's in points
(issue #27 asks bf16 to be within 0.5). One test image of the 359 is 0.28 points, so a single seed's
difference is mostly which few images a run happens to get right: the median over seeds is the
comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from minidnn import cli


def train(precision, epochs, seed, folder):
    t = time.perf_counter()
    rc = cli.main(["train", "--precision", precision, "--epochs", str(epochs), "--seed", str(seed), "--no-progress",
                   "--out", folder])
    if rc != 0:
        raise SystemExit(f"minidnn train --precision {precision} failed ({rc})")
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    return metrics[-1]["test_accuracy"], time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30, help="epochs of every run (default 30, the CLI's default)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated; the first is the reference")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds, each trained in every precision")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.precisions.split(","):
            results[p] = [train(p, args.epochs, s, os.path.join(tmp, f"{p}-{s}")) for s in seeds]
    ref_name = next(iter(results))
    median = {p: statistics.median(acc for acc, _ in runs) for p, runs in results.items()}
    print(f"\nLeNet-5 on the bundled digits, {args.epochs} epochs, seeds {args.seeds}:")
    for p, runs in results.items():
        each = ", ".join(f"{acc * 100:.2f}%" for acc, _ in runs)
        diff = "" if p == ref_name else f"  {(median[p] - median[ref_name]) * 100:+.2f} points vs {ref_name}"
        print(f"  {p:<5} median test accuracy {median[p] * 100:6.2f}% ({each}; "
              f"{statistics.median(s for _, s in runs):.1f} s a run){diff}")


if __name__ == "__main__":
    main()
