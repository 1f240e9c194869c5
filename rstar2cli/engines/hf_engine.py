"""The transformers engine: continuous batching over a KV token budget it accounts itself.

For machines without vLLM (e.g. a GPU box with only torch + transformers). One background task
per engine runs steps in a worker thread; each step
1. drops cancelled requests,
2. makes room for the decode step: every running sequence grows by one token, and when the budget
   cannot hold that, the most recently admitted sequence is preempted (its KV dropped, its tokens
   kept; it is recomputed later, as vLLM's recompute preemption does),
3. admits waiting requests first-come-first-served while their context fits what is left,
   prefilling each one (batch of one, no padding) and sampling its first token,
4. decodes all previously running sequences in one left-padded batch.
Every sequence owns its per-layer K/V tensors; `kv_used_tokens()` is the sum of their lengths, read
from the tensors, and never exceeds `kv_capacity_tokens()` (checked after every step).

Sampling: greedy at temperature 0, else temperature + top-p with one `torch.Generator` per request
(seeded from `SamplingSpec.seed`, or from the engine seed and a counter), so a request's samples do
not depend on what else is in the batch or on preemptions. Logprobs are those of the distribution
each token was drawn from (after temperature and top-p; greedy: the raw logits'), as the vLLM
engine reports them (`logprobs_mode` processed_logprobs).

What it does not do: prefix caching, chunked prefill, paged memory (the padded decode batch is
rebuilt every step; fine for the small models it is meant for).
Tested in tests/unit/test_hf_engine.py on the tiny model (CPU).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rstar2cli import protocol as P
from rstar2cli.engines.base import GenOutput, SamplingSpec, read_safetensors_folder

log = logging.getLogger(__name__)


@dataclass
class _Seq:
    """One request. NOTE: its KV holds prompt + out_ids[:-1]; out_ids[-1] is fed at the next decode."""

    request_id: str
    prompt_ids: list[int]
    spec: SamplingSpec
    stop_ids: frozenset[int]
    generator: Any  # torch.Generator
    future: asyncio.Future
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    kv: list[tuple[Any, Any]] | None = None  # per layer (K, V), each [1, H_kv, T, D]
    cancelled: bool = False

    @property
    def num_kv_tokens(self) -> int:
        return 0 if self.kv is None else int(self.kv[0][0].shape[2])

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.out_ids


class HfEngine:
    """A transformers causal LM with a continuous-batching step loop."""

    def __init__(
        self,
        model_path: str,
        *,
        name: str = "hf0",
        kv_cache_tokens: int,
        max_model_len: int = 4096,
        seed: int = 0,
        device: str | None = None,
        dtype: str | None = None,
        max_num_seqs: int = 256,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = name
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = getattr(torch, dtype) if dtype else "auto"
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype)
        self.model = model.to(self.device).eval()
        tokenizer: Any = AutoTokenizer.from_pretrained(model_path)
        self.im_end_id = int(tokenizer.convert_tokens_to_ids(P.IM_END))
        self._capacity = int(kv_cache_tokens)
        self._max_model_len = int(max_model_len)
        self._max_num_seqs = int(max_num_seqs)
        self._seed_counter = itertools.count(seed * 1_000_003)
        self._inbox: list[_Seq] = []  # touched only on the event loop
        self._waiting: deque[_Seq] = deque()  # touched only inside a step (or between steps)
        self._running: list[_Seq] = []  # in admission order
        self._num_kv_used = 0
        self._counters = {
            "num_prefix_queries": 0,  # no prefix cache: kept so every engine reports the same keys
            "num_prefix_hits": 0,
            "num_preempted_prefix_queries": 0,
            "num_preempted_prefix_hits": 0,
            "num_preemptions": 0,
            "num_steps": 0,
            "peak_kv_used_tokens": 0,
            "num_prompt_tokens": 0,
            "num_generation_tokens": 0,
        }
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._step_lock: asyncio.Lock | None = None
        self._closed = False

    # ---- Protocol surface -------------------------------------------------------------------
    def kv_capacity_tokens(self) -> int:
        return self._capacity

    def kv_block_size_tokens(self) -> int:
        return 1  # NOTE: its own KV accounting is per token

    def kv_used_tokens(self) -> int:
        return self._num_kv_used

    def metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self._counters.items()}
        out.update(
            kv_capacity_tokens=float(self._capacity),
            kv_used_tokens=float(self._num_kv_used),
            num_running_reqs=float(len(self._running)),
            num_waiting_reqs=float(len(self._waiting) + len(self._inbox)),
        )
        return out

    async def generate(
        self, request_id: str, prompt_ids: list[int], spec: SamplingSpec
    ) -> GenOutput:
        import torch

        if self._closed:
            return GenOutput(token_ids=[], logprobs=None, finish_reason="abort")
        if not prompt_ids or len(prompt_ids) >= self._max_model_len:
            return GenOutput(token_ids=[], logprobs=None, finish_reason="length")
        wake, _ = self._ensure_loop()
        generator = torch.Generator(device=self.device)
        generator.manual_seed(spec.seed if spec.seed is not None else next(self._seed_counter))
        # ignore_eos: no stop id, so the turn runs to max_tokens (this engine stops on nothing
        # else, the model's EOS included)
        stop_ids = (
            frozenset() if spec.ignore_eos else frozenset({*spec.stop_token_ids, self.im_end_id})
        )
        seq = _Seq(
            request_id=request_id,
            prompt_ids=list(prompt_ids),
            spec=spec,
            stop_ids=stop_ids,
            generator=generator,
            future=asyncio.get_running_loop().create_future(),
        )
        self._inbox.append(seq)
        wake.set()
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            seq.cancelled = True
            raise

    async def update_weights(self, named_tensors: dict[str, Any] | str) -> None:
        """Copy new weights in between two steps: a dict of tensors (HF names) or a HF folder."""
        tensors = (
            read_safetensors_folder(named_tensors)
            if isinstance(named_tensors, str)
            else named_tensors
        )
        _, step_lock = self._ensure_loop()
        async with step_lock:
            await asyncio.to_thread(self._load_state, tensors)

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        for seq in [*self._inbox, *self._waiting, *self._running]:
            _resolve(seq, "abort")
        self._inbox.clear()
        self._waiting.clear()
        self._running.clear()
        self._num_kv_used = 0
        self.model = None

    # ---- the loop ---------------------------------------------------------------------------
    def _ensure_loop(self) -> tuple[asyncio.Event, asyncio.Lock]:
        """The step loop's wake-up event and step lock, on the running event loop (started on
        first use, and again if the loop it ran on is gone)."""
        loop = asyncio.get_running_loop()
        task, wake, step_lock = self._task, self._wake, self._step_lock
        if task is not None and not task.done() and task.get_loop() is loop:
            assert wake is not None and step_lock is not None
            return wake, step_lock
        self._wake, self._step_lock = wake, step_lock = asyncio.Event(), asyncio.Lock()
        self._task = loop.create_task(self._run(wake, step_lock), name=f"{self.name}-steps")
        return wake, step_lock

    async def _run(self, wake: asyncio.Event, step_lock: asyncio.Lock) -> None:
        while True:
            if not (self._inbox or self._waiting or self._running):
                wake.clear()
                await wake.wait()
                continue
            self._waiting.extend(self._inbox)
            self._inbox.clear()
            async with step_lock:
                try:
                    finished = await asyncio.to_thread(self._step)
                except Exception:
                    log.exception("engine %s: step failed; failing its requests", self.name)
                    finished = [(s, "error") for s in [*self._waiting, *self._running]]
                    self._waiting.clear()
                    self._running.clear()
                    self._num_kv_used = 0
            for seq, reason in finished:
                _resolve(seq, reason)

    def _step(self) -> list[tuple[_Seq, str]]:
        import torch

        finished: list[tuple[_Seq, str]] = []
        for group in (self._waiting, self._running):
            for seq in [s for s in group if s.cancelled]:
                group.remove(seq)
                seq.kv = None
                finished.append((seq, "abort"))
        decoding = self._make_room(finished)
        admitted = self._admit(num_reserved=len(decoding), finished=finished)
        with torch.inference_mode():
            for seq in admitted:
                logits = self._prefill(seq)
                self._sample(seq, logits)
            if decoding:
                for seq, logits in zip(decoding, self._decode(decoding), strict=True):
                    self._sample(seq, logits)
        self._num_kv_used = sum(s.num_kv_tokens for s in self._running)
        # NOTE: the invariant the budget exists for; a violation is a bug in _make_room/_admit.
        assert self._num_kv_used <= self._capacity, (self._num_kv_used, self._capacity)
        self._counters["num_steps"] += 1
        self._counters["peak_kv_used_tokens"] = max(
            self._counters["peak_kv_used_tokens"], self._num_kv_used
        )
        for seq in list(self._running):
            reason = self._finish_reason(seq)
            if reason is not None:
                self._running.remove(seq)
                seq.kv = None
                finished.append((seq, reason))
        self._num_kv_used = sum(s.num_kv_tokens for s in self._running)
        return finished

    def _make_room(self, finished: list[tuple[_Seq, str]]) -> list[_Seq]:
        """Preempt newest-first until every running sequence can grow by one token."""
        while self._running and self._used() + len(self._running) > self._capacity:
            victim = self._running.pop()
            if not self._running:  # alone and still too long: the budget cannot hold it
                victim.kv = None
                finished.append((victim, "error"))
                break
            victim.kv = None
            self._waiting.appendleft(victim)
            self._counters["num_preemptions"] += 1
        return list(self._running)

    def _admit(self, num_reserved: int, finished: list[tuple[_Seq, str]]) -> list[_Seq]:
        admitted: list[_Seq] = []
        while self._waiting and len(self._running) < self._max_num_seqs:
            seq = self._waiting[0]
            need = len(seq.context_ids)
            if need > self._capacity:  # could never fit, even alone
                self._waiting.popleft()
                finished.append((seq, "error"))
                continue
            if self._used() + num_reserved + need > self._capacity:
                break
            self._waiting.popleft()
            self._running.append(seq)
            admitted.append(seq)
            num_reserved += need
        return admitted

    def _used(self) -> int:
        return sum(s.num_kv_tokens for s in self._running)

    def _finish_reason(self, seq: _Seq) -> str | None:
        if seq.out_ids and seq.out_ids[-1] in seq.stop_ids:
            return "stop"
        if len(seq.out_ids) >= seq.spec.max_tokens or len(seq.context_ids) >= self._max_model_len:
            return "length"
        return None

    # ---- model calls --------------------------------------------------------------------------
    def _prefill(self, seq: _Seq) -> Any:
        """Run the whole context (prompt + tokens kept from before a preemption); KV for all of it."""
        import torch
        from transformers import DynamicCache

        ids = torch.tensor([seq.context_ids], device=self.device)  # [1, T]
        cache = DynamicCache()
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        seq.kv = _layers_kv(cache)
        self._counters["num_prompt_tokens"] += ids.shape[1]
        return out.logits[0, -1]  # [V]

    def _decode(self, seqs: list[_Seq]) -> Any:
        """Feed each sequence's last token; one left-padded batch over all of them."""
        import torch
        from transformers import DynamicCache

        lengths = [s.num_kv_tokens for s in seqs]
        max_len = max(lengths)
        kvs = [s.kv for s in seqs if s.kv is not None]
        assert len(kvs) == len(seqs), "decode of a sequence with no KV (not prefilled)"
        layers = []
        for i in range(len(kvs[0])):
            keys = [_left_pad(kv[i][0], max_len) for kv in kvs]
            values = [_left_pad(kv[i][1], max_len) for kv in kvs]
            layers.append((torch.cat(keys), torch.cat(values)))  # [B, H_kv, max_len, D]
        mask = torch.zeros(
            len(seqs), max_len + 1, dtype=torch.long, device=self.device
        )  # [B, max_len+1]
        for b, n in enumerate(lengths):
            mask[b, max_len - n :] = 1
        ids = torch.tensor([[s.out_ids[-1]] for s in seqs], device=self.device)  # [B, 1]
        positions = torch.tensor([[n] for n in lengths], device=self.device)  # [B, 1]
        cache = DynamicCache(ddp_cache_data=layers)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        batch_kv = _layers_kv(cache)
        for b, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
            seq.kv = [
                (k[b : b + 1, :, max_len - n :], v[b : b + 1, :, max_len - n :])
                for k, v in batch_kv
            ]
        return out.logits[:, -1]  # [B, V]

    def _sample(self, seq: _Seq, logits: Any) -> None:
        import torch

        logits = logits.float()  # [V]
        spec = seq.spec
        if spec.temperature <= 0:
            token = int(torch.argmax(logits))
            logprob = torch.log_softmax(logits, dim=-1)[token]
        else:
            probs = torch.softmax(logits / spec.temperature, dim=-1)  # [V]
            if spec.top_p < 1.0:
                probs = _top_p_filter(probs, spec.top_p)
            token = int(torch.multinomial(probs, 1, generator=seq.generator))
            logprob = torch.log(probs[token])  # NOTE: the sampling distribution's, as vLLM's
        seq.out_ids.append(token)
        if spec.want_logprobs:
            seq.out_logprobs.append(float(logprob))
        self._counters["num_generation_tokens"] += 1

    def _load_state(self, tensors: dict[str, Any]) -> None:
        result = self.model.load_state_dict(dict(tensors), strict=False)
        if result.unexpected_keys:
            raise ValueError(
                f"weights not in the model: {', '.join(sorted(result.unexpected_keys)[:5])}"
            )


def _left_pad(t: Any, length: int) -> Any:
    import torch.nn.functional as F

    return F.pad(t, (0, 0, length - t.shape[2], 0))  # pad dim 2 (tokens) on the left


def _top_p_filter(probs: Any, top_p: float) -> Any:
    import torch

    sorted_probs, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p  # always keeps the top token
    filtered = torch.zeros_like(probs).scatter(0, order, sorted_probs * keep)
    return filtered / filtered.sum()


def _resolve(seq: _Seq, reason: str) -> None:
    if seq.future.done():
        return
    logprobs = list(seq.out_logprobs) if seq.spec.want_logprobs else None
    seq.future.set_result(
        GenOutput(token_ids=list(seq.out_ids), logprobs=logprobs, finish_reason=reason)
    )


def _layers_kv(cache: Any) -> list[tuple[Any, Any]]:
    """Per layer (K, V) of a transformers `DynamicCache`, each [B, H_kv, T, D]."""
    return [(layer.keys, layer.values) for layer in cache.layers]
