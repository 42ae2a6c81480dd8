"""The RLHF quickstart's data, generated from the demo's addition task (no downloads).

``write_dummy_data(out_dir)`` writes, for 2-digit sums ``a+b=`` answered as ``\\boxed{a+b}``:
- ``sft.jsonl`` / ``sft_eval.jsonl``: ``{"prompt": "37+58=", "completion": "\\boxed{95}"}``;
- ``preferences.jsonl`` / ``preferences_eval.jsonl``: the correct sum chosen over a wrong one,
  ``{"prompt": "37+58=", "chosen": "\\boxed{95}", "rejected": "\\boxed{131}"}``, the wrong one being the sum of
  another random pair at least 10 away (a learnable preference: right answers over clearly wrong ones);
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


MIN_ERROR = 10  # a rejected sum is at least this far from the right one: its tens (or hundreds) digit differs


def wrong_sum(a: int, b: int, rng: random.Random, digits: int = 2) -> int:
    """A wrong sum for a + b: half the time a near miss (off by 1 to MIN_ERROR - 1: a wrong units digit or carry),
    else the sum of another random pair of ``digits``-digit numbers at least ``MIN_ERROR`` away.

    With clearly wrong sums alone the reward model learnt to check magnitudes, not the addition (held-out
    pairwise accuracy 0.98), and PPO against it found near misses it scored as high as right answers: held-out
    accuracy of the SFT policy fell from 0.93 to 0.45 while the reward model's score rose. Near misses make the
    model check the units digit too."""
    if rng.random() < 0.5:
        offset = rng.randint(1, MIN_ERROR - 1) * rng.choice((-1, 1))
        return a + b + offset if a + b + offset >= 0 else a + b - offset
    low, high = 10 ** (digits - 1), 10**digits - 1
    while True:
        wrong = rng.randint(low, high) + rng.randint(low, high)
        if abs(wrong - (a + b)) >= MIN_ERROR:
            return wrong


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
        return [{"prompt": prompt_text(a, b), "completion": completion_text(a, b)} for a, b in pairs]

    def preferences(pairs):
        return [{"prompt": prompt_text(a, b), "chosen": completion_text(a, b),
                 "rejected": f"\\boxed{{{wrong_sum(a, b, rng, splits.digits)}}}"} for a, b in pairs]

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
