"""Protocol core on hand-written trajectories."""

import json

import pytest

from rstar2cli import protocol as P


def test_prompt_paper_template_ends_with_reason_and_lists_tool():
    text = P.render_prompt("What is 2+3?")
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n<reason>")
    assert "<tools>" in text and P.TOOL_NAME in text
    assert "This is the problem:\nWhat is 2+3?<|im_end|>" in text
    # the schema inside <tools> is valid JSON
    inner = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(inner)["function"]["name"] == P.TOOL_NAME


def test_prompt_release_template_differs_only_where_documented():
    text = P.render_prompt("Q", template="release")
    assert text.endswith("<|im_start|>assistant\n")
    assert "<reason> </reason> tags, using the Python tool" in text
    with pytest.raises(ValueError):
        P.render_prompt("Q", template="nope")


def test_parse_good_call_and_format_roundtrip():
    turn = "I will compute.\n" + P.format_tool_call("print(6*7)", stdin="x") + "<|im_end|>"
    (call,) = P.parse_tool_calls(turn)
    assert call.error is None
    assert (call.name, call.code, call.stdin) == (P.TOOL_NAME, "print(6*7)", "x")


@pytest.mark.parametrize(
    "inner, needle",
    [
        (
            '{"name": "execute_python_code_with_standard_io", "arguments": {"code": "print(1)"',
            "invalid JSON",
        ),
        ('{"name": "python", "arguments": {"code": "print(1)"}}', "unknown tool 'python'"),
        (
            '{"name": "execute_python_code_with_standard_io", "arguments": {}}',
            "missing required argument 'code'",
        ),
        (
            '{"name": "execute_python_code_with_standard_io", "arguments": {"code": 5}}',
            "missing required argument",
        ),
        ('["not", "an", "object"]', "must be a JSON object"),
        (
            '{"name": "execute_python_code_with_standard_io", "arguments": {"code": "1", "input": 3}}',
            "'input' must be a string",
        ),
    ],
)
def test_malformed_calls_become_parse_errors(inner, needle):
    (call,) = P.parse_tool_calls(f"<tool_call>\n{inner}\n</tool_call>")
    assert call.error is not None and needle in call.error


def test_arguments_as_json_string_are_accepted():
    inner = json.dumps({"name": P.TOOL_NAME, "arguments": json.dumps({"code": "print(2)"})})
    (call,) = P.parse_tool_calls(f"<tool_call>{inner}</tool_call>")
    assert call.error is None and call.code == "print(2)"


def test_several_calls_in_one_turn_only_first_runs_by_default():
    turn = P.format_tool_call("print(1)") + "\n" + P.format_tool_call("print(2)")
    assert [c.code for c in P.parse_tool_calls(turn)] == ["print(1)"]
    assert [c.code for c in P.parse_tool_calls(turn, max_calls=2)] == ["print(1)", "print(2)"]


def test_call_split_across_a_stop():
    # The engine stopped on the stop string "</tool_call>", which is cut from the text.
    complete = '<tool_call>\n{"name": "execute_python_code_with_standard_io", "arguments": {"code": "print(3)"}}\n'
    (call,) = P.parse_tool_calls(complete)
    assert call.error is None and call.code == "print(3)"
    # The response budget ran out in the middle of the JSON.
    cut = '<tool_call>\n{"name": "execute_python_code_with_standard_io", "argum'
    (call,) = P.parse_tool_calls(cut)
    assert call.error is not None and "unterminated tool call" in call.error


def test_no_call_no_result():
    assert P.parse_tool_calls("just reasoning </reason><answer>\\boxed{3}</answer>") == []


def test_tool_response_chunk_and_output_formatting():
    chunk = P.render_tool_response("42")
    assert (
        chunk
        == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>"
    )
    assert P.format_tool_output("ok", "42\n", "") == "42"
    err = P.format_tool_output("error", "", "Traceback...\nZeroDivisionError: division by zero\n")
    assert err.endswith("ZeroDivisionError: division by zero")
    assert "timed out" in P.format_tool_output("timeout", "partial\n", "")
    # stderr of a successful run (warnings) is not shown
    assert P.format_tool_output("ok", "1\n", "DeprecationWarning") == "1"


def test_truncation_middle_keeps_both_ends():
    text = "a" * 200 + "b" * 200
    out = P.truncate_text(text, 256, "middle")
    assert out.startswith("a" * 128) and out.endswith("b" * 128)
    assert "[144 characters truncated]" in out
    assert P.truncate_text("short", 256) == "short"
    assert P.truncate_text("abcdef", 3, "tail") == "abc...[3 characters truncated]..."
    assert P.truncate_text("abcdef", 3, "head") == "...[3 characters truncated]...def"


def test_layout_appends_ids_with_masks():
    lay = P.TrajectoryLayout(prompt_ids=[1, 2, 3])
    lay.add_model_tokens([10, 11])  # model turn ending with a tool call
    lay.add_tool_chunk([20, 21, 22])  # tool response: never trained on
    lay.add_model_tokens([12])
    assert lay.response_ids == [10, 11, 20, 21, 22, 12]
    assert lay.loss_mask == [1, 1, 0, 0, 0, 1]
    assert lay.num_model_tokens == 3
    assert lay.all_ids == [1, 2, 3, 10, 11, 20, 21, 22, 12]


@pytest.mark.parametrize(
    "text, strict, expected",
    [
        ("<answer>so \\boxed{\\frac{1}{2}}</answer>", False, "\\frac{1}{2}"),
        ("<answer>\\boxed{\\sqrt{\\frac{a}{b^{2}}}}</answer>", False, "\\sqrt{\\frac{a}{b^{2}}}"),
        ("\\boxed{1} <answer>\\boxed{2} then \\boxed{3}</answer>", False, "3"),
        ("<answer>\\boxed{1}</answer> later <answer>\\boxed{7}</answer>", False, "7"),
        ("reasoning \\boxed{5} and no answer block", False, "5"),
        ("reasoning \\boxed{5} and no answer block", True, None),
        ("<answer>no box</answer> \\boxed{9}", False, "9"),
        ("<answer>no box</answer> \\boxed{9}", True, None),
        ("<answer>\\boxed{(1, 2)}", False, "(1, 2)"),  # unclosed answer block at the budget
        ("\\boxed{unbalanced", False, None),
        ("<answer>\\fbox{4}</answer>", False, "4"),
    ],
)
def test_extract_answer(text, strict, expected):
    assert P.extract_answer(text, strict=strict) == expected


def test_trajectory_stats_count_statuses_not_printed_words():
    text = "<reason>x</reason><answer>\\boxed{1}</answer><answer>\\boxed{1}</answer>"
    stats = P.trajectory_stats(
        text, num_turns=3, tool_statuses=["ok", "error", "parse_error", "ok"]
    )
    assert stats.num_tool_calls == 4 and stats.num_tool_errors == 2
    assert stats.tool_status_counts == {"ok": 2, "error": 1, "parse_error": 1}
    assert stats.num_answer_tags == 2
    # a successful call whose stdout says "error" is still ok
    ok_stats = P.trajectory_stats("error error", 1, ["ok"])
    assert ok_stats.num_tool_errors == 0
