"""A few data-parallel training steps, run by the distributed tests under ``mpiexec -n N`` (or alone).

Every rank builds the same network from one seed and takes its slice of the same
global mini-batches; rank 0 writes the parameters, buffers and losses after the
last step to ``--out`` (an .npz), for the tests to compare with one process.
"""
import argparse
import os
import sys

import minidnn as mdn  # first: it sets the thread policies NumPy's BLAS reads when it loads
import numpy as np
from minidnn import nn, optim
from minidnn.distributed import launched, shard_range


def small_cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def small_bn_cnn():
    """small_cnn with a BatchNorm after each convolution (synchronized across the ranks)."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 10))


def flag_inf_once(replica):
    """This rank's loss scaling of its next step finds inf/NaN (as if its loss were), while its gradients
    stay finite: only the ranks' agreement on the flag makes the others skip the step too."""
    begin = replica.begin

    def flagged(ctx, plan, n_local):
        replica.begin = begin
        ctx = begin(ctx, plan, n_local)
        ctx.scaling.nonfinite_loss()
        return ctx
    replica.begin = flagged


def stop_inside_batchnorm(sync):
    """This process stops (SIGSTOP) when its BatchNorm ``sync`` next gathers statistics: the other ranks
    wait for it inside a synchronized BatchNorm collective."""
    import signal
    gather = sync.statistics

    def stop_then_gather(*args):
        os.kill(os.getpid(), signal.SIGSTOP)
        return gather(*args)
    sync.statistics = stop_then_gather


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["cnn", "cnn-bn", "resnet20"], default="cnn")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--batch", type=int, default=6)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--budget", default=None, help="bytes or a fraction of the liveness peak")
    p.add_argument("--policy", default="auto")
    p.add_argument("--sub-batches", action="store_true", help="a budget only a split of the mini-batch fits")
    p.add_argument("--k", type=int, default=0, help="with --sub-batches: the split must be into exactly K")
    p.add_argument("--bn", default="sync")
    p.add_argument("--bucket-bytes", type=int, default=4096)
    p.add_argument("--last-batch", type=int, default=0, help="a last, smaller global batch after the steps")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--hang-rank", type=int, default=-1, help="this rank stops (sleeps) before step 2")
    p.add_argument("--stop-rank", type=int, default=-1,
                   help="this rank stops itself (SIGSTOP) inside its first BatchNorm collective of step 2")
    p.add_argument("--seed", type=int, default=0, help="compile's seed")
    p.add_argument("--normalize", default=None, help="MEAN,STD: compile's input normalization")
    p.add_argument("--trace", default=None, help="each rank writes the last step's trace to TRACE/rankR.json")
    p.add_argument("--precision", default="fp32", help="compile's precision")
    p.add_argument("--every-rank", action="store_true",
                   help="each rank writes its state, loss and loss scale after every step to OUT.rankR.npz")
    p.add_argument("--overflow-rank", type=int, default=-1,
                   help="this rank's slice is multiplied by 1e6 at step --overflow-step (fp16 overflows)")
    p.add_argument("--flag-rank", type=int, default=-1,
                   help="this rank alone finds inf/NaN at step --overflow-step (its gradients finite)")
    p.add_argument("--overflow-step", type=int, default=1, help="the step (from 0) of --overflow/flag-rank")
    p.add_argument("--growth-interval", type=int, default=0, help="fp16: the loss scaler's growth interval")
    p.add_argument("--skew-scale", action="store_true",
                   help="fp16: rank r's loss scaler starts at 2^(16 - r) (rank 0's must be broadcast)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    with open(f"{args.out}.rank{os.environ.get('PMI_RANK', 0)}.pid", "w") as f:
        f.write(str(os.getpid()))
    parallel = launched(bn=args.bn, bucket_bytes=args.bucket_bytes, tail_bytes=1024, timeout=args.timeout)
    rank, size = (parallel.rank, parallel.size) if parallel is not None else (0, 1)
    if args.model == "cnn":
        net, image = small_cnn(), (3, 8, 8)
    elif args.model == "cnn-bn":
        net, image = small_bn_cnn(), (3, 8, 8)
    else:
        from minidnn.models import resnet20
        net, image = resnet20(num_classes=10), (3, 32, 32)
    net.init_parameters(0)
    budget = args.budget
    if budget is not None:
        budget = float(budget) if "." in budget else int(budget)
    memory = mdn.MemoryConfig(budget=budget, sub_batching=True, algorithms="default", policy=args.policy)
    normalize = tuple(float(v) for v in args.normalize.split(",")) if args.normalize else None
    trainer = mdn.compile(net, (args.batch, *image), nn.CrossEntropyLoss(),
                          optim.SGD(lr=args.lr, momentum=0.9, weight_decay=5e-4), memory=memory,
                          dtype=np.dtype(args.dtype), parallel=parallel, seed=args.seed, normalize=normalize,
                          precision=args.precision)
    if args.growth_interval or args.skew_scale:
        from minidnn.grad_scaler import GradScaler
        trainer.scaler = GradScaler(init_scale=2.0 ** (16 - (rank if args.skew_scale else 0)),
                                    growth_interval=args.growth_interval or 2000)
    history = {}
    if args.sub_batches:
        assert getattr(trainer.plan, "k", 1) > 1, "the budget did not split the mini-batch"
        assert args.k in (0, trainer.plan.k), f"the budget split the mini-batch into {trainer.plan.k}, not {args.k}"
    elif budget is not None:
        kinds = {s.kind for s in trainer.plan.program.steps} if hasattr(trainer.plan, "program") else set()
        assert kinds & {"offload", "recompute"}, "the budget evicted nothing (or split the mini-batch)"
        if args.policy == "recompute":
            from minidnn.ops.norm import BatchNorm2dOp
            assert any(s.kind == "recompute" and isinstance(s.node.op, BatchNorm2dOp)
                       for s in trainer.plan.program.steps), "no BatchNorm recomputed"
    rng = np.random.default_rng(1)
    sizes = [args.batch] * args.steps + ([args.last_batch] if args.last_batch else [])
    losses = []
    for t, b in enumerate(sizes):
        x = rng.standard_normal((b, *image))
        y = rng.integers(0, 10, size=b)
        lo, hi = shard_range(b, rank, size)
        if t == 1 and rank == args.hang_rank:
            import time
            time.sleep(3600)
        if t == 1 and rank == args.stop_rank:
            stop_inside_batchnorm(trainer.parallel.bn)
        if t == args.overflow_step and rank == args.overflow_rank:
            x = x * 1e6
        if t == args.overflow_step and rank == args.flag_rank:
            flag_inf_once(trainer.parallel)
        try:
            losses.append(trainer.step(x[lo:hi], y[lo:hi]))
        except mdn.DistributedError as e:
            print(f"worker: error: {e}", file=sys.stderr)
            # also in a file: the launcher may kill the job before it forwards this rank's stderr
            with open(f"{args.out}.rank{rank}.error", "w") as f:
                f.write(str(e))
            from minidnn.distributed.launch import abort
            abort(3)
            return 3
        if rank == 0:
            with open(f"{args.out}.steps", "w") as f:
                f.write(str(t + 1))
        if args.every_rank:
            history.update({f"{t}/{k}": np.array(v) for k, v in net.state_dict().items()})
            history[f"{t}/loss"] = np.array(losses[-1])
            if trainer.scaler is not None:
                history[f"{t}/scale"] = np.array(trainer.scaler.scale)
                history[f"{t}/skipped"] = np.array(trainer.scaler.skipped_steps)
    if args.trace:
        trainer.trace.save(os.path.join(args.trace, f"rank{rank}.json"))
    if args.every_rank:
        np.savez(f"{args.out}.rank{rank}.npz", **history)
    if rank == 0:
        state = {k: np.asarray(v) for k, v in net.state_dict().items()}
        np.savez(args.out, losses=np.array(losses), **state)
    if parallel is not None:
        trainer.parallel.close()
    print(f"rank {rank} of {size}: done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
