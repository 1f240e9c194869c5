"""A scripted engine for tests: a test double of the `Engine` Protocol that emits protocol text
we wrote (tokenized with the real tiny tokenizer), cut at `max_tokens` like a real engine. Asked
for log-probs, it gives token i of a request -0.1 * (i + 1)."""

from __future__ import annotations

import asyncio

from rstar2cli.engines.base import GenOutput
from rstar2cli.errors import EngineDead


class ScriptedEngine:
    """Returns scripted turns in order (per trajectory: keyed by the request-id prefix)."""

    def __init__(self, tok, scripts, capacity_tokens=100_000, fail=False, die_after=None):
        self.name = "scripted"
        self.tok = tok
        self.scripts = scripts  # {trajectory prefix: [turn text, ...]} or {"*": [...]}
        self.capacity = capacity_tokens
        self.fail = fail
        self.die_after = die_after  # requests answered before the engine dies (EngineDead)
        self.requests = []  # (request_id, prompt_ids, max_tokens)
        self.used = 0

    async def generate(self, request_id, prompt_ids, spec):
        self.requests.append((request_id, list(prompt_ids), spec.max_tokens))
        if self.fail:
            raise RuntimeError("engine died")
        if self.die_after is not None and len(self.requests) > self.die_after:
            raise EngineDead(f"engine {self.name} died: its process is gone")
        prefix = request_id.rsplit("-", 1)[0]
        queue = self.scripts.get(prefix, self.scripts.get("*"))
        text = queue.pop(0) if len(queue) > 1 else queue[0]
        ids = self.tok.encode(text, add_special_tokens=False)
        await asyncio.sleep(0.001 * len(ids) / 10)
        if len(ids) > spec.max_tokens:
            ids, rest = ids[: spec.max_tokens], ids[spec.max_tokens :]
            queue.insert(0, self.tok.decode(rest, skip_special_tokens=False))
            return GenOutput(token_ids=ids, logprobs=_logprobs(ids, spec), finish_reason="length")
        return GenOutput(token_ids=ids, logprobs=_logprobs(ids, spec), finish_reason="stop")

    def kv_capacity_tokens(self):
        return self.capacity

    def kv_block_size_tokens(self):
        return 1

    def kv_used_tokens(self):
        return self.used

    def metrics(self):
        return {"num_preemptions": 0.0}

    async def update_weights(self, named_tensors):
        pass

    async def shutdown(self):
        pass


def _logprobs(ids, spec):
    return [-0.1 * (i + 1) for i in range(len(ids))] if spec.want_logprobs else None
