"""The RLHF quickstart's data, generated from the demo's addition task (no downloads).

The task carries a stated formatting preference: the answer to ``a+b=`` belongs in a box, ``\\boxed{95}``. The
demonstrations do not keep to it (as if written by several annotators): half answer ``\\boxed{95}``, half a bare
``95``, so the SFT policy boxes about half its answers. The preference pairs state it: the boxed right answer is
chosen over the bare right answer (half the pairs) or over a boxed wrong sum (the other half: one digit of
the sum changed, or another pair's sum). The verifiable reward (``-rt boxed``) only accepts boxed answers, so a
policy that follows the preference also raises its held-out accuracy, and the reward model can learn the
preference exactly (the format) and the sums only as well as a model of the policy's size can check them.

``write_dummy_data(out_dir)`` writes
- ``sft.jsonl`` / ``sft_eval.jsonl``: ``{"prompt": "37+58=", "completion": "\\boxed{95}"}`` or ``"95"``;
- ``preferences.jsonl`` / ``preferences_eval.jsonl``: ``{"prompt": "37+58=", "chosen": "\\boxed{95}",
  "rejected": "95"}`` or ``"rejected": "\\boxed{91}"``;
- ``prompts.jsonl`` / ``prompts_eval.jsonl``: math rows (``{"messages": ..., "gt_answer": "95"}``) for the RL stage.
The held-out files use the GRPO demo's held-out problems (the same split, seed 0), which no training file
contains. ``python -m coati.rlhf.dummy OUT_DIR`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import random

from coati.dataset.demo_task import completion_text, make_splits, prompt_text, write_jsonl

DEMO_SPLIT = {"num_train": 2048, "num_eval": 512, "seed": 0, "digits": 2}  # the GRPO demo's (DemoRecipe)
MIN_ERROR = 10  # a far wrong sum is at least this far from the right one


def wrong_sum(a: int, b: int, rng: random.Random, digits: int = 2) -> int:
    """A wrong sum for a + b: half the time one digit of the right sum changed (the errors a policy makes: a units
    digit, a carry), else the sum of another random pair of ``digits``-digit numbers, at least ``MIN_ERROR`` away."""
    right = a + b
    if rng.random() < 0.5:
        text = str(right)
        position = rng.randrange(len(text))
        choices = [d for d in "0123456789" if d != text[position] and not (position == 0 and d == "0")]
        return int(text[:position] + rng.choice(choices) + text[position + 1 :])
    low, high = 10 ** (digits - 1), 10**digits - 1
    while True:
        wrong = rng.randint(low, high) + rng.randint(low, high)
        if abs(wrong - right) >= MIN_ERROR:
            return wrong


def bare_answer(a: int, b: int) -> str:
    """The answer without the preferred format."""
    return str(a + b)


def _write(rows: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def write_dummy_data(out_dir: str, num_sft: int = 8192, num_pairs: int = 4096, num_eval: int = 512,
                     seed: int = 0) -> dict[str, str]:
    """Write the six files into ``out_dir``; returns their paths by name (``sft``, ``sft_eval``, ...)."""
    os.makedirs(out_dir, exist_ok=True)
    splits = make_splits(**DEMO_SPLIT)
    rng = random.Random(seed + 7)
    sft_pairs = splits.warm_start_pairs(num_sft, seed=seed + 101)
    pref_pairs = splits.warm_start_pairs(num_pairs, seed=seed + 202)
    held_out = splits.eval[:num_eval]

    def sft(pairs):
        return [{"prompt": prompt_text(a, b),
                 "completion": completion_text(a, b) if rng.random() < 0.5 else bare_answer(a, b)} for a, b in pairs]

    def preferences(pairs):
        def rejected(a, b):
            if rng.random() < 0.5:
                return bare_answer(a, b)
            return f"\\boxed{{{wrong_sum(a, b, rng, splits.digits)}}}"

        return [{"prompt": prompt_text(a, b), "chosen": completion_text(a, b), "rejected": rejected(a, b)}
                for a, b in pairs]

    paths = {name: os.path.join(out_dir, f"{name}.jsonl") for name in
             ("sft", "sft_eval", "preferences", "preferences_eval", "prompts", "prompts_eval")}
    _write(sft(sft_pairs), paths["sft"])
    _write(sft(held_out), paths["sft_eval"])
    _write(preferences(pref_pairs), paths["preferences"])
    _write(preferences(held_out), paths["preferences_eval"])
    write_jsonl(splits.train, paths["prompts"])
    write_jsonl(held_out, paths["prompts_eval"])
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, path in write_dummy_data(args.out_dir, seed=args.seed).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
