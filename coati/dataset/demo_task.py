"""The embedded task: n-digit addition written as real math jsonl, answered as ``\\boxed{579}``.

Held-out pairs never appear in the train or warm-start data, so held-out accuracy measures generalisation.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass



def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def completion_text(a: int, b: int) -> str:
    return f"\\boxed{{{a + b}}}"


def _row(a: int, b: int) -> dict:
    return {"messages": {"role": "user", "content": prompt_text(a, b)}, "gt_answer": str(a + b)}


@dataclass
class DemoSplits:
    train: list[tuple[int, int]]
    eval: list[tuple[int, int]]
    held_out: set[tuple[int, int]]  # eval + train pairs; warm-start data avoids them
    digits: int

    def warm_start_pairs(self, count: int, seed: int) -> list[tuple[int, int]]:
        rng = random.Random(seed)
        pairs = []
        while len(pairs) < count:
            pair = _random_pair(rng, self.digits)
            if pair not in self.held_out:
                pairs.append(pair)
        return pairs


def _random_pair(rng: random.Random, digits: int) -> tuple[int, int]:
    low, high = 10 ** (digits - 1), 10**digits - 1
    return rng.randint(low, high), rng.randint(low, high)


def make_splits(num_train: int, num_eval: int, seed: int, digits: int = 2) -> DemoSplits:
    """Disjoint train and eval pairs of ``digits``-digit numbers."""
    if num_train + num_eval > 0.5 * (9 * 10 ** (digits - 1)) ** 2:
        raise ValueError(f"{num_train + num_eval} problems need more than {digits}-digit numbers")
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    pairs = []
    while len(pairs) < num_train + num_eval:
        pair = _random_pair(rng, digits)
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return DemoSplits(train=pairs[num_eval:], eval=pairs[:num_eval], held_out=seen, digits=digits)


def write_jsonl(pairs: list[tuple[int, int]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for a, b in pairs:
            handle.write(json.dumps(_row(a, b)) + "\n")
