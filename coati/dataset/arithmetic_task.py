"""The real-model demos' task: one-digit arithmetic (``a + b``, ``a - b``, ``a * b`` with a, b in 0..9) asked in
plain words: a chat row for an instruct model, scored by the last integer of the response (``--demo smollm2``), or
a plain-text row for a base model, scored by the first integer of its answer (``--demo gemma3``).

The chat row asks "Calculate 7 * 8." and no more. SmolLM2-135M-Instruct's greedy answer then starts by saying how
(78 of the 96 held-out: "To calculate 9 + 9, we simply add them together."), so when the demo ends a response at
its first full stop (``--stop .``) greedy is right on 21 of them, while some of 8 samples at T=1 state the answer
at once ("9 + 9 = 18."): 37 held-out problems are wrong greedy but right in a sample, room for RL to raise greedy
as well as sampled. With "Reply with just the number." added, greedy starts at 0.70 with 11 such problems
(docs/results.md). The 300 problems are shuffled once and split: held-out problems never appear in training.
"""

from __future__ import annotations

import itertools
import random
import re

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
PROMPT = "Calculate {a} {op} {b}."  # a change of wording writes new demo rows (smollm2.task_dir)
PLAIN_PROMPT = "What is {a} {op} {b}?"
_INTEGER = re.compile(r"-?\d+")


def problems() -> list[tuple[int, str, int]]:
    return [(a, op, b) for op, a, b in itertools.product(OPERATORS, range(10), range(10))]


def row(a: int, op: str, b: int) -> dict:
    return {"messages": [{"role": "user", "content": PROMPT.format(a=a, op=op, b=b)}],
            "gt_answer": str(OPERATORS[op](a, b))}


def plain_row(a: int, op: str, b: int) -> dict:
    """The problem as plain text, for a base model's prompt template."""
    return {"messages": PLAIN_PROMPT.format(a=a, op=op, b=b), "gt_answer": str(OPERATORS[op](a, b))}


def splits(num_eval: int, seed: int = 0, row=row) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): all 300 problems shuffled by ``seed``, each made a row by ``row``, the first
    ``num_eval`` held out."""
    shuffled = problems()
    random.Random(seed).shuffle(shuffled)
    rows = [row(*problem) for problem in shuffled]
    return rows[num_eval:], rows[:num_eval]


def last_integer(text: str) -> int | None:
    """The last integer written in ``text`` (a leading minus sign included), or None."""
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


def first_integer(text: str) -> int | None:
    """The first integer written in ``text`` (a leading minus sign included), or None."""
    found = _INTEGER.search(text)
    return int(found.group()) if found else None


def last_integer_reward(response: str, label, row: dict | None = None) -> tuple[float, dict]:
    """A ``--reward-fn`` function: 1.0 when the response's last integer equals the gold answer, else 0.0; the
    same verdict is the run's definition of correct (eval accuracy, the summary, the rollout logs)."""
    answer = last_integer(response)
    correct = answer is not None and answer == int(label)
    return float(correct), {"correct": correct}


def first_integer_reward(response: str, label, row: dict | None = None) -> tuple[float, dict]:
    """A ``--reward-fn`` function for a base model's few-shot answer: 1.0 when the response's first integer equals
    the gold answer (what follows it is the model going on, which ``--stop`` cuts), else 0.0; also the run's
    definition of correct."""
    answer = first_integer(response)
    correct = answer is not None and answer == int(label)
    return float(correct), {"correct": correct}
