"""`rstar2 eval --endpoint` never rewards an answer the tool printed.

The "model" behind the endpoint is a scripted policy served on loopback with the OpenAI
completions wire format (`/v1/models`, `/v1/completions` with token ids, as vLLM's server answers):
an untrained model cannot be made to attempt the hack on purpose, a script can. Its first turn
calls the Python tool with code that prints `<answer>\\boxed{89}</answer>`; the real in-process
sandbox runs it, so the boxed answer really lands in the trajectory (as masked tool output). Its
second turn either says nothing more (the hack: reward must be 0) or writes the same answer itself
(the control: reward 1). Everything after the endpoint is the real command.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from clihelpers import run_cli

from rstar2cli import protocol as P

LEAKY_CALL = P.format_tool_call('print("<answer>\\\\boxed{89}</answer>")') + P.IM_END
SECOND_TURN = {
    "hack": "</reason>\nThe tool already said it." + P.IM_END,
    "honest": "</reason>\n<answer>\\boxed{89}</answer>" + P.IM_END,
}


@contextmanager
def _scripted_server(tokenizer, policy: str):
    """A loopback OpenAI-style server whose completions follow the script; yields its URL."""
    tool_response_id = tokenizer.convert_tokens_to_ids(P.TOOL_RESPONSE_OPEN)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output clean
            pass

        def _send(self, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send({"data": [{"id": "scripted", "max_model_len": 4096}]})

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            turn = request["prompt"].count(tool_response_id)
            text = LEAKY_CALL if turn == 0 else SECOND_TURN[policy]
            ids = tokenizer.encode(text, add_special_tokens=False)[: request["max_tokens"]]
            self._send(
                {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": "stop"}]}
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("policy", "reward"), [("hack", 0.0), ("honest", 1.0)])
def test_eval_endpoint_rewards_only_the_models_own_answer(tmp_path, tiny_model_dir, policy, reward):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"question": "Compute 12*7+5.", "answer": "89"}) + "\n")
    out = tmp_path / "eval"
    with _scripted_server(tokenizer, policy) as url:
        res = run_cli(
            *["eval", "--endpoint", url, "--tokenizer", tiny_model_dir, "--data", data],
            *["--out", out, "--samples", 1, "--max-turns", 3, "--max-response-tokens", 400],
            timeout=300,
        )
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [c["status"] for c in row["tool_calls"]] == ["ok"]
    tool_output = row["text"].split(P.TOOL_RESPONSE_OPEN)[1].split(P.TOOL_RESPONSE_CLOSE)[0]
    assert "<answer>\\boxed{89}</answer>" in tool_output  # the tool really printed it
    assert row["reward"] == reward and row["correct"] is (reward == 1.0)
    assert row["finish_reason"] == ("no_answer" if policy == "hack" else "answer")
