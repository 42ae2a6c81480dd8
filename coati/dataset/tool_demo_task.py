"""The tool demo's task: products of two 3-digit numbers (``123*456=``), answered as ``\\boxed{56088}``.

A 2-layer model cannot multiply 3-digit numbers in its head, but it can copy: the operands into a call of the
``multiply`` tool, and the tool's result into the answer. The texts here are exactly what an episode of
``--env tool_demo`` holds (``coati/rollout/env.py`` ``MultiplyEnv``): the call in ``ToolEnv``'s syntax (compact
JSON), the tool response as ``ToolEnv.format_response`` writes it, then the answer. Train, held-out eval and
warm-start pairs are disjoint (``coati.dataset.demo_task.make_splits``).
"""

from __future__ import annotations

import json

CALL_OPEN = '<tool_call>{"name":"multiply","arguments":{"a":'
CALL_MID = ',"b":'
CALL_CLOSE = "}}</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "\n<tool_response>\n", "\n</tool_response>\n"
# Single tokens of the tool demo's tokenizer: the fixed parts of a call and of a response, and \boxed{.
TOOL_WORD_TOKENS = ("\\boxed{", CALL_OPEN, CALL_MID, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE)


def prompt_text(a: int, b: int) -> str:
    return f"{a}*{b}="


def call_text(a: int, b: int) -> str:
    """The model's first turn when it uses the tool."""
    return f"{CALL_OPEN}{a}{CALL_MID}{b}{CALL_CLOSE}"


def response_text(a: int, b: int) -> str:
    """The environment's answer to :func:`call_text` (what ``ToolEnv.format_response`` appends)."""
    return f"{RESPONSE_OPEN}{a * b}{RESPONSE_CLOSE}"


def answer_text(a: int, b: int) -> str:
    return f"\\boxed{{{a * b}}}"


def episode_texts(a: int, b: int, use_tool: bool) -> list[tuple[str, bool]]:
    """The response of an episode as (text, written by the model) pieces: call, tool response, answer; or the
    answer alone (the model multiplies in its head)."""
    if not use_tool:
        return [(answer_text(a, b), True)]
    return [(call_text(a, b), True), (response_text(a, b), False), (answer_text(a, b), True)]


def write_rows(pairs: list[tuple[int, int]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for a, b in pairs:
            row = {"messages": {"role": "user", "content": prompt_text(a, b)}, "gt_answer": str(a * b)}
            handle.write(json.dumps(row) + "\n")
