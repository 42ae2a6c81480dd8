"""The code demo's task: one-line specs in words, answered with a short stdin -> stdout program.

A spec names what to print in words (``x times 3 plus 7``, ``a minus b times 4``, ``last 3 letters of s``);
the program reads the input and prints it (``x=int(input())`` then ``print(x*3+7)``). The expression is the
word-for-word translation of the spec, evaluated with Python's precedence. Three families, by input:

- ``x``: one integer; ``x OP K OP C``, K in 2..9, C in 1..9;
- ``ab``: two integers on a line; ``a OP b OP C``;
- ``s``: one word; ``s repeated K times``, ``first K letters of s``, ``last K letters of s``.

A task is the spec (family, words, numbers): 756 of them (648 ``x``, 81 ``ab``, 27 ``s``). Rows are PRIME code rows with
``cases`` seeded test inputs each; train, eval and the warm start's dev split are disjoint sets of specs, and
the warm start trains on specs that are in none of them, so held-out pass rate measures generalisation to
unseen combinations.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

OPS = {"plus": "+", "minus": "-", "times": "*"}
READ = {"x": "x=int(input())", "ab": "a,b=map(int,input().split())", "s": "s=input()"}
STRING_FORMS = {"repeat": ("s repeated {k} times", "s*{k}"), "first": ("first {k} letters of s", "s[:{k}]"),
                "last": ("last {k} letters of s", "s[-{k}:]")}
FENCE_OPEN, FENCE_CLOSE = "```python\n", "```"


@dataclass(frozen=True)
class Spec:
    family: str  # x | ab | s
    words: tuple[str, ...]  # operator words (x, ab) or the string form (s)
    numbers: tuple[int, ...]

    @property
    def statement(self) -> str:
        if self.family == "s":
            return STRING_FORMS[self.words[0]][0].format(k=self.numbers[0])
        first, second = ("x", str(self.numbers[0])) if self.family == "x" else ("a", "b")
        return f"{first} {self.words[0]} {second} {self.words[1]} {self.numbers[-1]}"

    @property
    def expression(self) -> str:
        if self.family == "s":
            return STRING_FORMS[self.words[0]][1].format(k=self.numbers[0])
        first, second = ("x", str(self.numbers[0])) if self.family == "x" else ("a", "b")
        return f"{first}{OPS[self.words[0]]}{second}{OPS[self.words[1]]}{self.numbers[-1]}"

    @property
    def program(self) -> str:
        return f"{READ[self.family]}\nprint({self.expression})\n"

    def make_input(self, rng: random.Random) -> str:
        if self.family == "x":
            return f"{rng.randint(-99, 99)}\n"
        if self.family == "ab":
            return f"{rng.randint(-99, 99)} {rng.randint(-99, 99)}\n"
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) + "\n"

    def solve(self, text: str) -> str:
        if self.family == "x":
            variables = {"x": int(text)}
        elif self.family == "ab":
            a, b = map(int, text.split())
            variables = {"a": a, "b": b}
        else:
            variables = {"s": text.strip()}
        return f"{eval(self.expression, {}, variables)}\n"  # our own expression, built above from fixed parts


def all_specs() -> list[Spec]:
    specs = []
    for op1 in OPS:
        for op2 in OPS:
            specs += [Spec("x", (op1, op2), (k, c)) for k in range(2, 10) for c in range(1, 10)]
            specs += [Spec("ab", (op1, op2), (c,)) for c in range(1, 10)]
    for form in STRING_FORMS:
        specs += [Spec("s", (form,), (k,)) for k in range(1, 10)]
    return specs


def prompt_text(spec: Spec) -> str:
    return spec.statement + ":\n"


def completion_text(spec: Spec) -> str:
    return f"{FENCE_OPEN}{spec.program}{FENCE_CLOSE}"


def code_row(spec: Spec, rng: random.Random, cases: int) -> dict:
    inputs: list[str] = []
    while len(inputs) < cases:
        text = spec.make_input(rng)
        if text not in inputs:
            inputs.append(text)
    return {"messages": {"role": "user", "content": prompt_text(spec)},
            "test_cases": {"inputs": inputs, "outputs": [spec.solve(text) for text in inputs]},
            "task": spec.family}


@dataclass
class CodeDemoSplits:
    train: list[Spec]
    eval: list[Spec]
    dev: list[Spec]  # the warm start's stopping rule is measured on these
    warm: list[Spec]  # what the warm start trains on

    def warm_start_specs(self, count: int, seed: int) -> list[Spec]:
        rng = random.Random(seed)
        return [rng.choice(self.warm) for _ in range(count)]


def make_splits(num_train: int, num_eval: int, num_dev: int, seed: int) -> CodeDemoSplits:
    """Disjoint spec sets, each family in proportion to its size; the rest is the warm start's."""
    specs = all_specs()
    if num_train + num_eval + num_dev > len(specs) // 2:
        raise ValueError(f"{num_train + num_eval + num_dev} specs held out of {len(specs)}: keep at most half")
    random.Random(seed).shuffle(specs)
    held = num_eval + num_dev + num_train
    return CodeDemoSplits(eval=specs[:num_eval], dev=specs[num_eval:num_eval + num_dev],
                          train=specs[num_eval + num_dev:held], warm=specs[held:])


def write_rows(specs: list[Spec], path: str, seed: int, cases: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for spec in specs:
            handle.write(json.dumps(code_row(spec, rng, cases)) + "\n")
