"""The completions-response parsing of `EndpointEngine` (wire format as vLLM 0.32's OpenAI server
returns it; the engine itself runs against a real server in tests/integration/test_eval_cli.py)."""

from __future__ import annotations

import pytest

from rstar2cli.engines.endpoint_engine import EndpointError, base_url, parse_choice

IM_END = 1


def _resp(**choice):
    return {"choices": [{"index": 0, "text": "x", **choice}]}


def test_token_ids_from_return_token_ids_and_stop_kept():
    # vLLM keeps the stop id (here the EOS <|im_end|>, stop_reason None) at the end of token_ids
    out = parse_choice(
        _resp(token_ids=[5, 6, IM_END], finish_reason="stop", stop_reason=None), [IM_END], False
    )
    assert out.token_ids == [5, 6, IM_END] and out.finish_reason == "stop" and out.logprobs is None


def test_missing_stop_id_is_appended():
    out = parse_choice(
        _resp(token_ids=[5, 6], finish_reason="stop", stop_reason=IM_END), [IM_END], False
    )
    assert out.token_ids == [5, 6, IM_END]
    out = parse_choice(
        _resp(token_ids=[5, 6], finish_reason="stop", stop_reason=None), [IM_END], False
    )
    assert out.token_ids == [5, 6, IM_END]


def test_fallback_to_logprob_tokens_spelled_as_ids():
    logprobs = {"tokens": ["token_id:6", "token_id:7"], "token_logprobs": [-0.5, -1.25]}
    out = parse_choice(_resp(logprobs=logprobs, finish_reason="length"), [IM_END], True)
    assert (
        out.token_ids == [6, 7] and out.logprobs == [-0.5, -1.25] and out.finish_reason == "length"
    )


def test_no_token_ids_is_a_clear_error():
    with pytest.raises(EndpointError, match="no token ids"):
        parse_choice(_resp(finish_reason="length"), [IM_END], False)


def test_logprobs_padded_for_an_appended_stop_id():
    logprobs = {"token_logprobs": [-0.1, -0.2]}
    out = parse_choice(
        _resp(token_ids=[5, 6], logprobs=logprobs, finish_reason="stop", stop_reason=IM_END),
        [IM_END],
        True,
    )
    assert out.token_ids == [5, 6, IM_END] and out.logprobs == [-0.1, -0.2, 0.0]


def test_base_url_accepts_v1_suffix_and_bare_host():
    assert base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert base_url("localhost:8000") == "http://localhost:8000"
