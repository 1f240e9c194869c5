"""Partial rollout (rstar2cli/rl/partial.py and `driver.run_rollout`'s `stop_when` / `carried`):
a run cut once enough prompt instances are whole, its unfinished trajectories saved to JSON,
loaded and finished in a second run, end exactly as an uninterrupted run ends them.

The engine is the scripted test double (tests/unit/scripted.py); tools run in a real
`LocalSandbox`, grading in the real `Grader`.
"""

from __future__ import annotations

import asyncio

import pytest
from scripted import ScriptedEngine

from rstar2cli import protocol as P
from rstar2cli.agent.loop import AgentConfig
from rstar2cli.agent.tools import ToolBatcher
from rstar2cli.data.tiny import build_tokenizer
from rstar2cli.errors import UserError
from rstar2cli.reward.grader import Grader
from rstar2cli.rl.partial import (
    Carry,
    StepInstances,
    end_step,
    fresh_items,
    num_fresh,
    stale_token_share,
)
from rstar2cli.rollout.jobs import GradedSink, rollout_and_grade
from rstar2cli.scheduler.scheduler import SchedulerConfig
from rstar2cli.train_utils import batch_indices, stream_indices
from sandboxd.pool import LocalSandbox

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CALL = P.format_tool_call("print(37*41+5)") + P.IM_END
ANSWER = "</reason>\n<answer>\\boxed{1522}</answer>" + P.IM_END
LONG = "</reason>\n" + "we check the product once more. " * 12 + "<answer>\\boxed{1522}</answer>"
LONG += P.IM_END
PROBLEMS = [{"id": f"p{i}", "question": f"Compute 37*41+{i}.", "answer": "1522"} for i in range(4)]
NUM_SAMPLES = 2
CONFIG = AgentConfig(max_turns=4, max_response_tokens=400, seed=3)
# requests of at most 16 tokens: LONG takes many, so the long samples are still running at the cut
SCHED = SchedulerConfig(step_tokens=16, min_step_tokens=4)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _script(item: dict) -> list[str]:
    """p0, p1: both samples answer at once; p2, p3: a tool call, then a long answer."""
    return [ANSWER] if item["id"] in ("p0", "p1") else [CALL, LONG]


async def _roll(tok, sandbox, grader, items, scripts, carried=(), instances=None):
    sink = GradedSink(grader, flush_every=None)
    stats = await rollout_and_grade(
        [ScriptedEngine(tok, scripts)],
        items,
        tok,
        CONFIG,
        SCHED,
        ToolBatcher(sandbox),
        sink,
        on_record=None if instances is None else instances.on_record,
        carried=carried,
        stop_when=None if instances is None else instances.enough,
    )
    return sink.rows, stats


def test_a_cut_run_carried_through_json_ends_as_an_uninterrupted_run(tok, tmp_path):
    items = fresh_items(PROBLEMS, NUM_SAMPLES, step=0)
    assert [i["group"] for i in items] == ["0.0", "0.0", "0.1", "0.1", "0.2", "0.2", "0.3", "0.3"]

    async def go():
        async with LocalSandbox(num_workers=2, timeout_s=5.0) as sandbox:
            with Grader(num_workers=1, strict=True) as grader:
                # reference: every sample to its end in one run
                ref_rows, _ = await _roll(
                    tok,
                    sandbox,
                    grader,
                    items,
                    {f"t{k}": _script(it) for k, it in enumerate(items)},
                )
                # step 0: stop once 2 instances are whole, cut the rest, save them as JSON
                carry = Carry()
                instances = StepInstances(carry, NUM_SAMPLES, num_prompts=2)
                scripts = {f"t{k}": _script(it) for k, it in enumerate(items)}
                rows0, stats0 = await _roll(tok, sandbox, grader, items, scripts, (), instances)
                whole0, carry = end_step(carry, len(PROBLEMS), rows0, instances, stats0.unfinished)
                left = {id(t): scripts[f"t{items.index(t.item)}"] for t in carry.trajectories}
                carry.save(tmp_path / "carried.json")
                loaded = Carry.load(tmp_path / "carried.json", tok, CONFIG)
                assert [t.state() for t in loaded.trajectories] == [
                    t.state() for t in carry.trajectories
                ]
                # step 1: no fresh prompts; the carried go on where they stood
                assert num_fresh(2, 1.0, loaded) == 4 - loaded.num_instances
                instances1 = StepInstances(loaded, NUM_SAMPLES, num_prompts=2)
                scripts1 = {f"t{k}": left[id(t)] for k, t in enumerate(carry.trajectories)}
                rows1, _ = await _roll(
                    tok, sandbox, grader, [], scripts1, loaded.trajectories, instances1
                )
                whole1, last = end_step(loaded, 0, rows1, instances1, [])
                return ref_rows, whole0, carry, loaded, whole1, last

    ref_rows, whole0, carry, loaded, whole1, last = asyncio.run(go())
    assert {r["group"] for r in whole0} >= {"0.0", "0.1"}  # the short ones were whole at the cut
    assert carry.trajectories, "the long samples were still running when the step was cut"
    assert carry.cursor == len(PROBLEMS) and loaded.cursor == len(PROBLEMS)
    for traj in carry.trajectories:  # each cut between requests, its tokens so far stale
        assert not traj.done and traj.pending_call is None
        assert traj.stale_tokens == len(traj.layout.response_ids) > 0
    assert loaded.rows == carry.rows
    # every sample exactly once over the two steps, and each ends as it did uninterrupted
    done = whole0 + whole1
    assert sorted((r["group"], r["sample"]) for r in done) == sorted(
        (r["group"], r["sample"]) for r in ref_rows
    )
    assert not last.rows and not last.trajectories
    ref = {(r["group"], r["sample"]): r for r in ref_rows}
    keys = ("response_ids", "loss_mask", "finish_reason", "num_turns", "model_text", "reward")
    for r in done:
        assert {k: r[k] for k in keys} == {k: ref[r["group"], r["sample"]][k] for k in keys}
    assert all(r["reward"] == 1.0 and len(r["tool_calls"]) == 1 for r in whole1)
    assert [(r["group"], r["sample"]) for r in whole1] == sorted(
        (r["group"], r["sample"]) for r in whole1
    )
    for r in carry.rows:  # finished, but their instance was not: every token an older policy's
        assert r["stale_tokens"] == len(r["response_ids"])
    stale = sum(t.stale_tokens for t in carry.trajectories)
    stale += sum(r["stale_tokens"] for r in carry.rows)
    assert stale_token_share(whole1) == pytest.approx(
        stale / sum(len(r["response_ids"]) for r in whole1)
    )
    assert 0 < stale_token_share(whole1) < 1 and stale_token_share(whole0) == 0


def test_carry_load_names_a_missing_file(tok, tmp_path):
    with pytest.raises(UserError, match="carried.json is missing"):
        Carry.load(tmp_path / "carried.json", tok, CONFIG)


def test_fresh_prompts_top_up_the_instances_in_flight_from_the_data_stream():
    carry = Carry(cursor=7, rows=[{"group": "3.1"}, {"group": "3.1"}])
    assert num_fresh(4, 0.5, carry) == 6 - 1
    assert num_fresh(4, 0.0, Carry()) == 4
    # the stream a partial run draws from is the one plain steps take their batches from
    assert stream_indices(3 * 5, 5, 11, seed=2) == batch_indices(3, 11, 5, seed=2)
    assert (
        stream_indices(8, 6, 11, seed=2)
        == (batch_indices(1, 11, 8, seed=2) + batch_indices(2, 11, 8, seed=2))[:6]
    )


def test_the_default_correction_weighs_stale_tokens_as_the_module_says():
    """rl/partial.py's docstring against the code: under the default correction (token TIS, cap
    2) a carried token sampled by an older policy is weighted by min(pi_old / mu, 2)."""
    import torch

    import rstar2cli.rl.partial as partial
    from rstar2cli.rl.correction import token_weights
    from rstar2cli.rl.train_recipe import CorrectionConfig

    # pi_old 0.5 each; the older policy drew them with mu = 0.25, 0.5, 0.1: rho = 2, 1, 5
    weights, sums = token_weights(
        old_logprobs=torch.log(torch.tensor([0.5, 0.5, 0.5])),
        rollout_logprobs=torch.log(torch.tensor([0.25, 0.5, 0.1])),
        rows=torch.zeros(3, dtype=torch.long),
        stale=torch.ones(3, dtype=torch.bool),
        cfg=CorrectionConfig(),
        num_sequences=1,
    )
    assert torch.allclose(weights, torch.tensor([2.0, 1.0, 2.0]))
    assert sums.num_truncated == 1 and sums.num_masked_tokens == 0
    doc = " ".join(str(partial.__doc__).split())
    assert "stale tokens are not importance-weighted" not in doc
    assert "weighs each stale token by pi_old / mu" in doc
