"""Every threshold of the planner's search, in one place, each with the measurement behind it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Knobs:
    """The search's thresholds (``plan_memory(..., knobs=Knobs(...))`` to try others).

    Figures are planning-only (``scripts/bench_memory.py``) unless said otherwise.
    """

    # Greedy: candidates costed exactly per decision (their changed chains walked again). 1 is the
    # estimate alone; 16 took ResNet-152 b256 @ 12 GiB on v100 from +15.9% to +9.7% and ResNet-50
    # b256 @ 25% on h100 from +13.2% to +10.9%; the walks stay under a second on ResNet-1001.
    exact_candidates: int = 16
    # Greedy: the share of a chain's prefetch time charged to the decision that makes the chain
    # prefetch (issued just before the chain, the step waits for it unless the copy timing moves it).
    chain_copy_share: float = 1.0
    # Greedy: the share of a copy's time charged even where its gap hides it (the copy stream is
    # shared by every offload: the Capuchin-style bias towards recomputing cheap layers).
    copy_bias: float = 0.25
    # ... and the biases of seeds that charge copies otherwise (on schedules of at most
    # ``baseline_seed_steps`` steps), each greedy's plan then timed like the others. In full (1.0):
    # it offloads other tensors than the greedy does, and the greedy's choice can recompute long
    # chains instead: DenseNet-small b4 @ 40% on v100 2430.8 -> 2391.5 us, recomputing 141 us
    # instead of 418. Nothing (0.0): copies that their gaps hide are cheaper than a slower
    # convolution, which a quarter of a copy's latency-bound time is not: random DAG 16 (seed 0) @
    # 80% on v100 290.2 -> 282.8 us, @ 40% 381.3 -> 335.6 us (bench_optimal.py).
    copy_biases: tuple = (1.0, 0.0)
    # Greedy: the copy time one iteration can hide, as a share of its compute; beyond it a copy is
    # charged in full. (The seed "greedy, copy stream by direction" gives an offload from the
    # forward to the backward the room its two queues have instead: DenseNet-121 b128 @ 25% on
    # h100 +41.9% -> +23.5%, a100 +36.0% -> +29.6%.)
    copy_capacity: float = 0.9
    # Target search: rounds of lowering the greedy's target (overshoot, then bisection).
    fit_rounds: int = 8
    # Horizon search (program.lower's keep_within) starts here and doubles while it gets faster;
    # it runs where a plan has over ``rechain`` recompute steps per recomputed value (below that,
    # searching costs a deep network's planning more time than its plan gains).
    horizon: int = 16
    rechain: float = 3.0
    # sqrt(n) segments are a seed where their first lowering has at most this many recompute steps
    # per schedule step (CheckpointSqrt.rework): VGG-16, ResNet-50/101/152, GoogLeNet and
    # DenseNet-121 have 1.1-3.4, a 1001-layer ResNet 10 (3.2 million steps: a minute to lower).
    sqrt_rework: float = 6.0
    # ... and where the best plan so far is over this share slower than the unlimited step: the
    # segments recompute about one forward (a third of a step), so they rarely beat a plan within a
    # few percent (planning them costs ResNet-152 b256 seconds). They do beat one within a tenth:
    # ResNet-152 b256 @ 25% on v100, the segments with their recomputations offloaded +9.2%, the
    # greedy's best +9.8%; at a twentieth no bench_memory.py cell loses a plan the segments win.
    segments_over: float = 0.05
    # Recompute-only and the papers' policies are seeds of ``auto``, and the final repairs
    # (repairs.FINISH) run, for schedules of at most this many steps: each
    # costs a lowering and a replay (0.3 s apiece on ResNet-1001's 10040 steps, whose plan must
    # take at most 2 s; ResNet-152's 2,000 steps take 0.05 s).
    baseline_seed_steps: int = 5000
    # A staged split's k is chosen by plans whose search has ``baseline_seed_steps`` set to this
    # (the seeds and repairs it leaves out cost most of a split's planning and rarely move which k
    # is fastest); only the k chosen is then planned in full. ResNet-18 b512 @ 30% on titanx, per
    # k, full against chosen-with: k=4 1971.1 / 1971.5 ms, k=8 1940.3 / 1945.9 ms, k=16 1953.8 /
    # 1956.6 ms, in 12.7 / 1.1, 18-21 / 1.4-1.8 and 46 / 2.8 s CPU: the same k. The 10 commands of
    # bench_planning_time.py get the same plans (ResNet-18 65 -> 20 s CPU, GoogLeNet 27 -> 19 s);
    # ResNet-20 b32 @ 15% on v100 gets k=2 at 21.62 ms where every k in full finds k=4 at 21.24
    # (tests/test_planning_time_staged.py). None: every k in full.
    split_choice_seed_steps: int | None = 0
    # The greedy with its chains' prefetches charged nothing ("greedy, chain copies hidden") is a
    # seed on schedules over ``baseline_seed_steps`` steps too: the split choice's lighter search
    # sets it. At 11% of ResNet-50 b256's liveness peak on a100-40gb that search, without it,
    # rated 2 and 4 sub-batches 2667.7 and 2705.2 ms (stalls; the full search 2102.4 and 1710.0,
    # that seed winning) and stopped at k=2 (2102.4 ms, slower than 10%'s 1717.4); with it, 16
    # sub-batches at 1419.6 ms, and the README's sweep is monotone from 10% to 80%.
    hidden_chain_seed: bool = False
    # A step that fits whole is split into k (subbatch.plan_step, sub_batching="fastest") only where
    # k times its steps are at most this many: the staged iteration is about k times the step, and
    # planning one takes 1-2 ms of CPU per step. ResNet-4010 b16 in 12 GiB on titanx (40130 steps,
    # whole 12141.7 ms in 94 s) planned k=2 and 4 in 122 and 367 s (19545 and 15382 ms); the
    # README's sweep plans fitting steps up to k=16 (ResNet-50 b256: 16 x 530 steps), and
    # ResNet-1001's k=2 (2 x 10040) is still tried. None: every k.
    split_trial_steps: int | None = 50_000
    # The greedy is also a seed at these shares of the limit (on schedules of at most
    # ``baseline_seed_steps`` steps): its model frees an offload's bytes over its whole gap, while
    # the timed copies hold them while they run, so a plan that fits with no room to spare stalls:
    # random DAG 16 @ 60% on v100 330.7 -> 290.2 us, DAG 24 @ 40% 656.6 -> 576.0 us, ResNet-152 b256
    # @ 50% on v100 +3.2% -> +2.9% (bench_optimal.py, bench_memory.py). With the greedy that times
    # its offloads for their peaks as a seed too (``timed_offloads``), DAG 24 @ 40% 560.2 -> 547.5 us
    # (tests/test_planner_search.py). (): no such seeds.
    copy_room: tuple = (0.95, 0.9, 0.8)
    # The final repairs (repairs.FINISH) run on this many of the fastest plans that fit (with
    # different decisions): a slower plan with room under the limit keeps more. ResNet-50 b256 @ 50%
    # on h100: the best alone +3.15%, four +3.08%, eight +2.93% (the 10%-room seed's plan), twelve
    # no better; v100 +2.81% from four on (planning only).
    finish_plans: int = 8
    # The search keeps the plans of this many distinct decisions (planner.Builds), each with its
    # lowering (a few MB on a staged iteration of thousands of steps): the repairs ask for the same
    # decisions again, mostly within the same seed's repairs. ResNet-18 b512 @ 30% on titanx, staged
    # as 2 x 256: 920 lowerings, 306 of them distinct, 9.6 -> 3.0 s CPU (64 kept: 338 lowered).
    # 0: none kept.
    kept_builds: int = 64
    # The search's lowerings record their state this many times, evenly over the schedule
    # (program.lower's ``checkpoints``), and a new lowering starts from the last checkpoint it shares
    # with a kept one (the copy timing's trials of one plan share about two thirds of their pass on
    # ResNet-18 b512's staged iterations: 4 x 128 @ 30% on titanx 22.7 -> 15.4 s CPU). Copying the
    # state is O(live tensors) per checkpoint; ResNet-1001 (10040 steps) plans as fast. 0: none.
    lowering_checkpoints: int = 32
    # The copy timing (transfers.hide_transfers) and the repairs after it call a plan stalled where its
    # compute waits for copies for over this share of its step: then the own timing is tried beside
    # the queued one, the timing is run again from the timed plan, and the offload trades go on
    # halving (repairs.py). Below it a plan's waits are noise next to what another pass costs.
    stall_share: float = 0.01
    # The copy timing holds buffers longer and prefetches earlier within the limit less this share of
    # it (and less the plan's own fragmentation): what placing the longer-held buffers adds.
    placement_headroom: float = 0.01
    # The copy timing's placements per timing where the extended plan overshoots: the extensions held
    # below the room by twice the overshoot, and ``copy_timing_tries - 1`` bisections of the share of
    # every extension.
    copy_timing_tries: int = 3
    # Offloads the compute waits for are turned into recomputations (transfers.recompute_stalled) where
    # a wait is over this share of the step longer than the producer's forward, for at most
    # ``stalled_rounds`` rounds while each is faster.
    stalled_worth: float = 1e-3
    stalled_rounds: int = 2
    # Greedy: an offload is timed for the peak it lowers (greedy.Greedy._timed): its buffer held
    # until its copy out is done (issued beside the touch that opens the gap where that touch only
    # reads it) and prefetched early enough to hide the copy back, each within the gap's side of the
    # peak, and charged what that leaves exposed; a later peak inside the gap times it again. False:
    # its bytes freed over the whole gap and charged what the whole gap cannot hide, as if the copies
    # took no memory. The search runs the greedy both ways ("greedy, offloads timed at the peak", on
    # schedules of at most ``baseline_seed_steps`` steps): random DAG 16 (seed 0) @ 40% on v100
    # 335.6 -> 302.9 us against an optimum over every timing of 293.3, at its minimum budget 345.9 ->
    # 303.0 us, the optimum (bench_optimal.py --timings independent).
    timed_offloads: bool = False
