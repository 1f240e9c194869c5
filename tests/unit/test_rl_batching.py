"""The RL step's pure parts: collate alignment, update plans, and group selection with RoC."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import torch

from rstar2cli.recipe import load_recipe
from rstar2cli.rl.batch import TrainSample, collate
from rstar2cli.rl.selection import rollout_metrics, select
from rstar2cli.rl.stage_recipe import RlRecipe
from rstar2cli.rl.trainer import lr_factor, plan_update, token_budget_micro_batches

REPO = Path(__file__).resolve().parents[2]


def test_collate_lists_the_model_tokens_and_the_positions_predicting_them():
    a = TrainSample([1, 2, 3], [7, 8, 9], [1, 0, 1], 0.5)
    b = TrainSample([1, 2], [5, 6], [1, 1], -0.5)
    batch = collate([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 7, 8, 9], [1, 2, 5, 6, 0, 0]]
    # a: position 2 (token 3) predicts 7, position 4 predicts 9; the tool-response token 8 is
    # not trained on. b: positions 1 and 2 predict 5 and 6.
    assert list(zip(batch.rows.tolist(), batch.cols.tolist(), strict=True)) == [
        (0, 2),
        (0, 4),
        (1, 1),
        (1, 2),
    ]
    assert batch.targets.tolist() == [7, 9, 5, 6]
    assert batch.input_ids[batch.rows, batch.cols + 1].tolist() == batch.targets.tolist()
    assert batch.advantages.tolist() == [0.5, 0.5, -0.5, -0.5]


def test_lr_warms_up_then_stays_constant():
    assert [lr_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, 0) == 1.0


def _sample(num_tokens: int, num_prompt: int = 3) -> TrainSample:
    n = num_tokens - num_prompt
    return TrainSample([1] * num_prompt, [2] * n, [1] * n, 1.0)


def test_token_budget_packs_longest_first_while_rows_times_longest_fit():
    # lengths 10, 8, 6, 5, 5, 3 with a budget of 20 padded tokens:
    # [10, 8]: 2 rows x 10 = 20 fits; adding 6 -> 3 x 10 = 30 does not
    # [6, 5, 5]: 3 x 6 = 18 fits; adding 3 -> 4 x 6 = 24 does not
    # [3]
    lengths = [10, 8, 6, 5, 5, 3]
    micro = token_budget_micro_batches([_sample(n) for n in lengths], max_tokens=20)
    assert [[s.num_tokens for s in mb] for mb in micro] == [[10, 8], [6, 5, 5], [3]]
    # a trajectory over the budget gets a micro-batch of its own
    alone = token_budget_micro_batches([_sample(30), _sample(4)], max_tokens=20)
    assert [[s.num_tokens for s in mb] for mb in alone] == [[30], [4]]


def test_plan_balances_tokens_and_gives_every_rank_as_many_micro_batches():
    # 7 trajectories of 4..10 tokens, 2 ranks, budget 16. Longest first to the lighter rank:
    #   10 -> r0 (10), 9 -> r1 (9), 8 -> r1 (17), 7 -> r0 (17), 6 -> r0 (23), 5 -> r1 (22),
    #   4 -> r1 (26)
    # r0 [10, 7, 6]: [10] (2 x 10 > 16), [7, 6] (2 x 7 = 14)       -> 2 micro-batches
    # r1 [9, 8, 5, 4]: [9] (2 x 9 > 16), [8, 5] (16), [4]          -> 3 micro-batches
    # so r0 gets one empty micro-batch: both ranks run 3 backward passes.
    samples = [_sample(n) for n in range(4, 11)]
    plan, tokens = plan_update(
        samples, num_mini_batches=1, world=2, max_tokens_per_micro_batch=16, seed_key=(0, 0)
    )
    sizes = [[[s.num_tokens for s in mb] for mb in rank[0]] for rank in plan]
    assert sizes == [[[10], [7, 6], []], [[9], [8, 5], [4]]]
    assert tokens == [sum(n - 3 for n in range(4, 11))]  # model tokens: all but the 3-token prompt
    again, _ = plan_update(samples, 2, 1, 16, (0, 3))
    twice, _ = plan_update(samples, 2, 1, 16, (0, 3))
    assert [[[id(s) for s in mb] for mb in mini] for mini in again[0]] == [
        [[id(s) for s in mb] for mb in mini] for mini in twice[0]
    ]
    assert sorted(s.num_tokens for mini in again[0] for mb in mini for s in mb) == list(
        range(4, 11)
    )


def _record(pid: str, sample: int, reward: float, statuses: list[str]) -> dict:
    return {
        "id": pid,
        "sample": sample,
        "reward": reward,
        "prompt_ids": [1, 2],
        "response_ids": [3, 4],
        "loss_mask": [1, 1],
        "tool_calls": [{"status": s} for s in statuses],
        "num_turns": 2,
        "num_answer_tags": 1,
        "finish_reason": "answer",
    }


def test_select_drops_equal_groups_and_keeps_clean_successes():
    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe)  # G = 4 of 8, min 1 / 1
    mixed = [_record("a", i, 1.0, ["ok"] if i < 2 else ["error", "ok"]) for i in range(4)]
    mixed += [_record("a", 4 + i, 0.0, ["ok"]) for i in range(4)]
    solved = [_record("b", 8 + i, 1.0, ["ok"]) for i in range(8)]  # all correct: dropped
    sel = select(mixed + solved, recipe, step=0)
    assert sel.num_groups == 2 and sel.num_dropped_groups == 1
    assert len(sel.samples) == 4
    # 4 positives of 8 -> quota 2 positives: the two zero-penalty ones (p_total 0 is drawn first)
    assert [s.tool_statuses for s in sel.kept_summaries if s.is_positive] == [("ok",), ("ok",)]
    adv = sorted(s.advantage for s in sel.samples)
    assert adv[0] < 0 < adv[-1] and abs(sum(adv)) < 1e-5
    m = rollout_metrics(mixed + solved, sel)
    assert m["reward"] == 12 / 16 and m["pass_rate"] == 1.0
    assert m["tool_error_share_correct"] == 2 / 14  # 2 errored of 14 calls in the 12 correct ones
    assert m["tool_error_share_correct_kept"] == 0.0
    plain = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe, ["roc.enabled=false"])
    assert len(select(mixed + solved, plain, step=0).samples) == 8


def test_advantages_are_tensors_of_the_kept_group():
    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe, ["roc.enabled=false"])
    recs = [_record("a", 0, 1.0, []), _record("a", 1, 0.0, [])]
    sel = select(recs, recipe, step=5)
    assert torch.allclose(
        torch.tensor([s.advantage for s in sel.samples]), torch.tensor([1.0, -1.0]), atol=1e-4
    )


def test_select_groups_partial_rollout_rows_by_prompt_instance():
    """Two instances of one prompt (partial rollout: one carried from an earlier step, one fresh)
    are two groups: each has its own mix of rewards."""
    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe, ["roc.enabled=false"])
    older = [_record("a", i, float(i % 2), []) | {"group": "3.0"} for i in range(2)]
    fresh = [_record("a", i, 1.0, []) | {"group": "4.1"} for i in range(2)]  # all right: dropped
    sel = select(older + fresh, recipe, step=4)
    assert (sel.num_groups, sel.num_dropped_groups, len(sel.samples)) == (2, 1, 2)
    assert sorted(s.advantage for s in sel.samples) == pytest.approx([-1.0, 1.0], abs=1e-4)


# --- failures that are not the model's leave their group -------------------------------------

CALL = "Let me compute.\n<tool_call>\n{code}\n</tool_call><|im_end|>"
RIGHT = "</reason>\n<answer>\\boxed{1522}</answer><|im_end|>"
WRONG = "</reason>\n<answer>\\boxed{7}</answer><|im_end|>"


async def _fault_daemon(status: int, delay_s: float):
    """An HTTP server on loopback standing in for a sandbox daemon in trouble: it answers every
    request with `status` after `delay_s` (a 5xx, or no answer in the client's time)."""
    from aiohttp import web

    async def answer(_request):
        await asyncio.sleep(delay_s)
        return web.Response(status=status, text="overloaded")

    app = web.Application()
    app.router.add_post("/v1/batch", answer)
    app.router.add_post("/v1/stream", answer)
    runner = web.AppRunner(app, shutdown_timeout=0.0)  # no wait for a request still held
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _real_records(pid: str) -> list:
    """Graded records of problem `pid` made by the real agent loop (scripted turns, a real
    LocalSandbox, the real SandboxClient against a dead URL and a failing daemon, the real
    grader). Samples: 0 clean and right; 1 its code raised, then right; 2 its code ran out of
    time, then wrong; 3 wrong; 4-6 right or wrong but their call met the infrastructure (daemon
    unreachable, HTTP 500, no answer in the client's time); 7 engine_error."""
    from scripted import ScriptedEngine

    from rstar2cli import protocol as P
    from rstar2cli.agent.loop import AgentConfig, Trajectory, prompt_ids_for, run_trajectory
    from rstar2cli.agent.tools import ToolBatcher
    from rstar2cli.data.tiny import build_tokenizer
    from rstar2cli.reward.grader import Grader
    from rstar2cli.rollout.jobs import GradedSink
    from sandboxd.client import SandboxClient
    from sandboxd.pool import LocalSandbox

    tok = build_tokenizer()
    config = AgentConfig(max_response_tokens=2000)
    short = AgentConfig(max_response_tokens=2000, tool_timeout_s=0.5)  # the endless snippet's
    call = {
        name: CALL.format(code=P.format_tool_call(code).split("\n", 1)[1].rsplit("\n", 1)[0])
        for name, code in [
            ("ok", "print(37*41+5)"),
            ("raise", "print(1/0)"),
            ("hang", "while True: pass"),
        ]
    }
    scripts = [
        [call["ok"], RIGHT],
        [call["raise"], RIGHT],
        [call["hang"], WRONG],
        [WRONG],
        [call["ok"], RIGHT],
        [call["ok"], WRONG],
        [call["ok"], WRONG],
        [RIGHT],
    ]

    async def go():
        sandbox = LocalSandbox(num_workers=1, timeout_s=5.0)
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        failing, failing_url = await _fault_daemon(500, 0.0)
        silent, silent_url = await _fault_daemon(200, 1.0)
        clients = [
            SandboxClient([f"http://127.0.0.1:{dead.getsockname()[1]}"], max_attempts=2),
            SandboxClient([failing_url], max_attempts=2),
            SandboxClient([silent_url], timeout_s=0.3, max_attempts=2),
        ]
        runners = [sandbox] * 4 + clients + [sandbox]
        item = {"id": pid, "question": "Compute 37*41+5.", "answer": "1522"}
        try:
            runs = []
            for i, (turns, runner) in enumerate(zip(scripts, runners, strict=True)):
                engine = ScriptedEngine(tok, {"*": list(turns)}, fail=i == 7)
                traj = Trajectory(
                    item={**item, "sample": i},
                    prompt_ids=prompt_ids_for(item["question"], tok),
                    tokenizer=tok,
                    config=short if i == 2 else config,
                )
                runs.append(run_trajectory(traj, engine, ToolBatcher(runner), f"{pid}{i}"))
            return await asyncio.gather(*runs)
        finally:
            for runner in [sandbox, *clients]:
                await runner.close()
            await failing.cleanup()
            await silent.cleanup()
            dead.close()

    records = asyncio.run(go())
    with Grader(num_workers=1, strict=True) as grader:
        sink = GradedSink(grader, flush_every=None)
        for r in records:
            sink.add(r)
        sink.flush()
    return sink.rows


def test_infrastructure_failures_leave_their_group_and_the_models_own_errors_stay():
    from rstar2cli.rl.roc import RolloutSummary, total_penalty

    rows = _real_records("p")
    statuses = [[c["status"] for c in r["tool_calls"]] for r in rows]
    assert statuses == [["ok"], ["error"], ["timeout"], [], *[["sandbox_error"]] * 3, []]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert rows[7]["finish_reason"] == "engine_error" and rows[7]["response_ids"] == []

    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe, ["roc.enabled=false"])
    sel = select(rows, recipe, step=0)
    # the four the model answered for are trained on: rewards 1, 1, 0, 0 -> advantages +1, -1
    assert len(sel.samples) == 4
    assert [s.response_ids for s in sel.samples] == [r["response_ids"] for r in rows[:4]]
    assert [round(s.advantage, 4) for s in sel.samples] == [1.0, 1.0, -1.0, -1.0]
    # the model's own errors count against it in RoC's penalty (p_err 1 for one failed call)
    penalties = [total_penalty(RolloutSummary.from_record(r)) for r in rows[:3]]
    assert penalties == [0.0, 1.0, 1.0]
    m = rollout_metrics(rows, sel)
    assert (m["num_engine_error_rollouts"], m["num_sandbox_error_rollouts"]) == (1, 3)
    assert m["num_groups_too_few_left"] == 0 and m["num_kept"] == 4
    from rstar2cli.rl.selection import infra_failure

    assert [infra_failure(r) for r in rows] == [None] * 4 + ["sandbox_error"] * 3 + ["engine_error"]

    # a group with one trajectory left after its failures is dropped, and counted
    other = [dict(r, id="q") for r in rows[3:]]
    sel = select(rows + other, recipe, step=0)
    assert (sel.num_groups, sel.num_groups_too_few_left, len(sel.samples)) == (2, 1, 4)
    m = rollout_metrics(rows + other, sel)
    assert (m["num_engine_error_rollouts"], m["num_sandbox_error_rollouts"]) == (2, 6)
