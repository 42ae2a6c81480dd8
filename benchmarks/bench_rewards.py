"""Math reward speed: answers/s per core before and after, and the share of a demo step spent scoring.

"before" is the per-sample math-verify path (``score_before`` below: every response reads its gold and its
answer with math-verify, LaTeX parser in ANTLR's default LL mode, and compares them; no fast path, nothing
shared within a group); "after" is what producers call, ``RewardScorer.score`` on one prompt's group (gold
read once, each distinct answer checked once, plain numbers compared exactly, two-stage SLL/LL parsing).
Both give the same verdicts (checked here on every response). Times are CPU seconds of this process.

1. Answers/s on one core (OMP_NUM_THREADS=1, one process) on generated groups of G=8 responses:
   - plain-number golds, GSM8K-like: integers (some with thousands commas) and decimals; the model answers
     right ~45%, wrong ~47% (a few distinct wrong numbers per group), no box 8%; 0%, 2% or 10% of the boxed
     answers are decorated (``\\$72``, ``72 \\text{ apples}``) and go through math-verify. Target >= 20,000/s.
   - LaTeX golds, MATH-like: fractions, radicals, multiples of pi, intervals, points, linear expressions,
     choice letters, percentages, powers, solution lists, each gold with its own random numbers, answered
     right (in the gold's form or another) or wrong, as above. Every gold and most answers are strings the
     parser has not seen, as in a pass over a MATH-like set. Target >= 1,500/s.
   - LaTeX groups of the same kind, each timed on its second scoring: every string is then in math-verify's
     own parse cache, as in a timing loop that scores one pair again and again (the issue's 961/s).
2. Share of a demo step spent scoring: the demo's model and data, the demo's settings (32 prompts per step,
   G=8, T=1, 8 new tokens), generation with the transformers backend, one GRPO step of the single-process
   plugin on those rollouts, and the step's 256 responses scored both ways. Target < 10% after.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rewards.py [--groups 256] [--latex-groups 48]
        [--demo-steps 4] [--skip-demo] [--skip-throughput]
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # one core, also for torch in the demo-step part (set before importing it)

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from fractions import Fraction  # noqa: E402
from types import SimpleNamespace  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from rewards.latex_parsing import enable_two_stage_parsing  # noqa: E402
from rewards import reward_type as reward_type_spec  # noqa: E402
from rewards.math import GoldAnswer  # noqa: E402
from rewards.scorer import RewardScorer  # noqa: E402

G = 8
REASONING = ("Let me work through this carefully. First I write down what is given and what is asked. "
             "Combining the two facts gives an intermediate value, which I check against the constraints. "
             "Then I simplify the expression step by step and double-check the arithmetic. ")


def score_before(responses: list[str], gold: str, reward_type: str = "boxed") -> list[bool]:
    """The plain per-sample path: each response reads the gold and its answer with math-verify (its LaTeX
    parser in plain LL mode, as shipped)."""
    extract = reward_type_spec(reward_type).math_format.extract
    verdicts = []
    enable_two_stage_parsing(False)
    try:
        for response in responses:
            answer = extract(response)
            verdicts.append(answer is not None and GoldAnswer(gold, fast_path=False).matches(answer))
    finally:
        enable_two_stage_parsing()
    return verdicts


def score_after(scorer: RewardScorer, responses: list[str], gold: str) -> list[bool]:
    return [r.correct for r in scorer.score(responses, SimpleNamespace(gt_answer=gold))]


def _respond(rng: random.Random, answer: str | None) -> str:
    text = REASONING * rng.randint(1, 3)
    return text + "I could not finish." if answer is None else f"{text}So the answer is $\\boxed{{{answer}}}$."


def _group(rng: random.Random, right: list[str], wrong: list[str]) -> list[str]:
    """G responses: no box 8%, right 45% (the first form most often), wrong otherwise."""
    answers = []
    for _ in range(G):
        u = rng.random()
        if u < 0.08:
            answers.append(None)
        elif u < 0.53:
            answers.append(right[0] if rng.random() < 0.6 else rng.choice(right))
        else:
            answers.append(rng.choice(wrong))
    return [_respond(rng, a) for a in answers]


def _number_text(rng: random.Random, value, decorated: float) -> str:
    text = f"{value:,}" if isinstance(value, int) and value >= 1000 and rng.random() < 0.5 else str(value)
    u = rng.random()
    if u < decorated / 2:
        return f"\\${text}"
    if u < decorated:
        return f"{text} \\text{{ apples}}"
    return text


def plain_number_groups(rng: random.Random, count: int, decorated: float) -> list[tuple[str, list[str]]]:
    groups = []
    for _ in range(count):
        kind = rng.random()
        value = rng.randint(2, 200) if kind < 0.6 else rng.randint(200, 20000) if kind < 0.85 else \
            round(rng.uniform(1, 100), 2)
        gold = f"{value:,}" if isinstance(value, int) and value >= 1000 and rng.random() < 0.3 else str(value)
        step = 1 if isinstance(value, int) else 0.5
        wrong_values = [value + step * d for d in rng.sample([-10, -3, -1, 1, 2, 5, 12], 3)] + [value * 2]
        right = [_number_text(rng, value, decorated) for _ in range(3)]
        wrong = [_number_text(rng, round(v, 2) if isinstance(v, float) else v, decorated) for v in wrong_values]
        groups.append((gold, _group(rng, right, wrong)))
    return groups


def _latex_case(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(gold, right answers, wrong answers) in MATH's style, with fresh numbers."""
    a, b = rng.randint(2, 97), rng.randint(2, 97)
    kind = rng.randrange(10)
    if kind == 0:
        f = Fraction(min(a, b), max(a, b) + 1)
        p, q = f.numerator, f.denominator
        return f"\\frac{{{p}}}{{{q}}}", [f"\\frac{{{p}}}{{{q}}}", f"\\dfrac{{{p}}}{{{q}}}", f"{p}/{q}"], \
            [f"\\frac{{{q}}}{{{p}}}", f"\\frac{{{p + 1}}}{{{q}}}", f"{p / q:.2f}"]
    if kind == 1:
        r = rng.choice([2, 3, 5, 6, 7])
        return f"{a}\\sqrt{{{r}}}", [f"{a}\\sqrt{{{r}}}", f"\\sqrt{{{a * a * r}}}"], \
            [str(a), f"{a}\\sqrt{{{r + 1}}}", f"{a + 1}\\sqrt{{{r}}}"]
    if kind == 2:
        return f"{a}\\pi", [f"{a}\\pi", f"{a} \\pi"], [str(a), f"{2 * a}\\pi", f"\\frac{{{a}\\pi}}{{2}}"]
    if kind == 3:
        lo, hi = sorted((a, b + 100))
        return f"[{lo}, {hi})", [f"[{lo},{hi})"], [f"({lo},{hi})", f"[{lo},{hi}]", f"[{lo},{hi + 1})"]
    if kind == 4:
        return f"({a}, -{b})", [f"({a},-{b})", f"\\left({a}, -{b}\\right)"], [f"(-{b},{a})", f"({a},{b})"]
    if kind == 5:
        return f"{a}x+{b}", [f"{a}x+{b}", f"{b}+{a}x"], [f"{a}x-{b}", f"{b}x+{a}", f"{a}x"]
    if kind == 6:
        letter = rng.choice("ABCDE")
        others = [c for c in "ABCDE" if c != letter]
        return f"\\text{{({letter})}}", [letter, f"({letter})", f"\\text{{({letter})}}"], others[:3]
    if kind == 7:
        return f"{a}\\%", [f"{a}\\%", str(a)], [f"{b + 100}\\%", f"{a + 1}\\%"]
    if kind == 8:
        base, power = rng.randint(2, 9), rng.randint(3, 12)
        return f"{base}^{{{power}}}", [f"{base}^{{{power}}}", str(base**power)], \
            [str(base * power), f"{base}^{{{power + 1}}}", str(base**power + 1)]
    return f"-{a}, {b + 100}", [f"-{a}, {b + 100}", f"{b + 100}, -{a}"], [f"{a}, {b + 100}", f"-{a}"]


def latex_groups(rng: random.Random, count: int) -> list[tuple[str, list[str]]]:
    groups = []
    for _ in range(count):
        gold, right, wrong = _latex_case(rng)
        groups.append((gold, _group(rng, right, wrong)))
    return groups


def answers_per_second(groups, fn) -> tuple[float, list[list[bool]]]:
    start = time.process_time()
    verdicts = [fn(responses, gold) for gold, responses in groups]
    elapsed = time.process_time() - start
    return sum(len(r) for _, r in groups) / elapsed, verdicts


def throughput(args) -> list[tuple[str, float, float, str]]:
    scorer = RewardScorer("boxed")

    def after(responses, gold):
        return score_after(scorer, responses, gold)

    # warm-up on other strings: imports, compiled regexes, the LaTeX parser's prediction tables
    for gold, responses in latex_groups(random.Random(99), 8) + plain_number_groups(random.Random(99), 8, 0.1):
        score_before(responses, gold)
        after(responses, gold)
    rows = []
    mixes = [(f"plain-number golds, {share:.0%} decorated", plain_number_groups(random.Random(0), args.groups, share),
              20000) for share in (0.0, 0.02, 0.1)]
    mixes.append(("LaTeX golds, new strings", latex_groups(random.Random(1), args.latex_groups), 1500))
    for name, groups, target in mixes:
        before, verdicts_before = answers_per_second(groups, score_before)
        after_rate, verdicts_after = answers_per_second(groups, after)
        if verdicts_before != verdicts_after:
            raise SystemExit(f"{name}: before and after disagree on some verdicts")
        correct = sum(map(sum, verdicts_after)) / sum(map(len, verdicts_after))
        rows.append((name, before, after_rate, f">= {target:,}/s", correct))
    # each group scored once to fill math-verify's parse cache, then timed on its second scoring
    groups = latex_groups(random.Random(2), args.latex_groups)
    rates = {"before": [0.0, 0], "after": [0.0, 0]}
    for gold, responses in groups:
        for label, fn in (("before", score_before), ("after", after)):
            fn(responses, gold)
            start = time.process_time()
            fn(responses, gold)
            rates[label][0] += time.process_time() - start
            rates[label][1] += len(responses)
    rows.append(("LaTeX golds, strings seen before", rates["before"][1] / rates["before"][0],
                 rates["after"][1] / rates["after"][0], "(the issue's 961/s)", None))
    return rows


def demo_step_share(steps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.algorithm.advantage import group_advantages
    from coati.algorithm.loss import PolicyLossConfig, batch_normaliser
    from coati.algorithm.policy_losses import LossInputs, policy_loss
    from coati.config.sampling import SamplingParams
    from coati.dataset.jsonl import load_jsonl
    from coati.demo.math_demo import ensure_demo_assets
    from coati.plugins.torch_single import SingleProcessPlugin
    from coati.rollout.generation import rollout_groups, tokenise_prompts
    from coati.algorithm.batch import collate, split_micro_batches, token_logprobs
    from coati.rollout.inference_backend import TransformersBackend

    torch.set_num_threads(1)
    torch.manual_seed(0)
    assets = ensure_demo_assets(log=lambda line: print("  demo assets:", line))
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    policy = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)
    generator = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)  # the producer's copy
    examples, _ = tokenise_prompts(tokenizer, load_jsonl(assets.train_path, "boxed"), "", 64)
    backend = TransformersBackend(generator, tokenizer, prompts_per_call=64 // G)  # 64 samples a call
    sampling = SamplingParams(n=G, temperature=1.0, max_new_tokens=8)
    plugin = SingleProcessPlugin()
    plugin.setup(policy, 3e-4)
    loss_config = PolicyLossConfig()  # the GRPO preset: clip 0.2/0.2, sample-level, no KL

    def loss_fn(logits, micro):
        logprobs = token_logprobs(logits, micro["input_ids"])
        return policy_loss(LossInputs(logprobs, micro["old_logprobs"], micro["advantages"], micro["action_mask"],
                                      float(micro["normaliser"][0])), loss_config)

    class TimedScorer(RewardScorer):
        spent = 0.0

        def score_groups(self, groups, examples):
            start = time.process_time()
            try:
                return super().score_groups(groups, examples)
            finally:
                TimedScorer.spent += time.process_time() - start

    scorer = TimedScorer("boxed")
    rows = []
    for step in range(steps + 1):  # step 0 warms up
        batch = examples[step * 32 : (step + 1) * 32]
        TimedScorer.spent = 0.0
        start = time.process_time()
        groups = rollout_groups(backend, scorer, batch, sampling, version=step)
        generate_s = time.process_time() - start - TimedScorer.spent
        after_s = TimedScorer.spent
        start = time.process_time()
        for (example, _, _), group in zip(batch, groups):
            score_before(group.texts, example.gt_answer)
        before_s = time.process_time() - start
        start = time.process_time()
        tensors = collate(groups, tokenizer.pad_token_id)
        tensors["advantages"] = group_advantages(torch.tensor([g.rewards for g in groups])).reshape(-1)
        tensors["normaliser"] = torch.full((tensors["input_ids"].shape[0],),
                                           batch_normaliser(tensors["action_mask"], loss_config.loss_variation))
        plugin.forward_backward(split_micro_batches(tensors, 256), loss_fn)
        plugin.optimizer_step(1.0)
        train_s = time.process_time() - start
        generator.load_state_dict(policy.state_dict())  # in-process stand-in for the weight broadcast
        if step:
            rows.append((generate_s, train_s, before_s, after_s))
    generate_s, train_s, before_s, after_s = (statistics.median(column) for column in zip(*rows))
    return {"generate_s": generate_s, "train_s": train_s, "before_s": before_s, "after_s": after_s,
            "before_share": before_s / (generate_s + train_s + before_s),
            "after_share": after_s / (generate_s + train_s + after_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=256, help="plain-number groups of G=8")
    parser.add_argument("--latex-groups", type=int, default=48, help="LaTeX groups of G=8 (slow: sympy parsing)")
    parser.add_argument("--demo-steps", type=int, default=4)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    print(f"math reward speed, one process, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, groups of G={G}, "
          "CPU time")
    if not args.skip_throughput:
        print(f"{'answers/s per core':34s} {'before':>9s} {'after':>9s} {'ratio':>7s}  target        share correct")
        for name, before, after, target, correct in throughput(args):
            share = "" if correct is None else f"{correct:.2f}"
            print(f"{name:34s} {before:9,.0f} {after:9,.0f} {after / before:6.1f}x  {target:13s} {share}")
    if not args.skip_demo:
        demo = demo_step_share(args.demo_steps)
        print(f"demo step (median of {args.demo_steps}; 32 prompts x G={G}): generation {demo['generate_s']:.3f} s, "
              f"GRPO step {demo['train_s']:.3f} s, scoring before {demo['before_s']:.3f} s / after "
              f"{demo['after_s']:.4f} s")
        print(f"share of a demo step spent scoring: before {demo['before_share']:.1%}, after "
              f"{demo['after_share']:.1%} (target < 10%)")


if __name__ == "__main__":
    main()
