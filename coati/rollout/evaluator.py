"""Held-out evaluation during training (``-ei N``): a dedicated evaluator actor fed with pinned weights.

Design. Two ways were weighed:

(a) producer 0 evaluates between rounds (its ``run`` loop checks for eval requests at round starts);
(b) a separate evaluator actor with its own inference backend, handed the weights to evaluate.

This module is (b), for four reasons:

1. *Exact weights.* Producers only ever hold published versions (one per producer round), and producer 0
   reaches its next round start only after it has loaded a newer version, so under (a) an eval "at step N"
   would really be at the first round boundary after N, and with DAPO's filtering (rounds and steps do not
   line up) not even that is predictable. Here the driver takes a snapshot of the trainer's weights right
   after step N (``Consumer.snapshot_weights``: the published object when step N ended on a sync, otherwise
   one extra gather), so the eval at step N evaluates exactly the policy after N optimizer steps.
2. *No coupling, no deadlock.* The evaluator waits on nothing but weights already in the object store; the
   producers' protocol (round r waits for version r) and the trainers' publishing are untouched, so skipped
   DAPO steps, the last rounds, or ``-ei`` larger than the run cannot make either side wait on the other.
3. *No stall.* Under (a) an eval holds up producer 0's next round, so the trainers starve for its whole
   duration; here it runs beside training and the driver only collects results between steps.
4. *Small, local change.* The producer loop (also edited for resume and learner-side generation) is not
   touched.

Under ``--weight-sync collective`` the evaluator still gets its snapshots through the object store, not as a
member of the broadcast group: a snapshot is usually *not* a published version (step N between two syncs), the
group would make every publish wait until the evaluator (busy evaluating) takes part, and a snapshot is one
``ray.put`` per -ei steps, so the object store costs little here.

The cost: one more copy of the model (its own engine: with ``-b vllm`` another KV cache too) and, while
evals are pending, their weight snapshots in the object store. The driver keeps at most ``MAX_PENDING``
steps' evals in flight and waits for the oldest beyond that (back-pressure instead of unbounded memory).
With ``-ei 0`` (evaluation only before and after training) no evaluator is built: producer 0 evaluates
then, while it is idle, as before.

Decoding: every task is evaluated twice, ``greedy`` (temperature 0) and ``sampled`` (temperature 1, the
training distribution), one completion per prompt, scored with the training reward.
"""

from __future__ import annotations

import ray
import torch

from coati.cluster.weight_sync import unpack_named_tensors
from coati.config.tree import RLConfig
from coati.config.sampling import SamplingParams
from coati.dataset.loader import load_examples
from coati.rollout.engine_guard import EngineFailed
from coati.rollout.env import load_env
from coati.rollout.episode import episode_budget
from coati.rollout.evaluation import held_out_row
from coati.rollout.reward_model import reward_model_scorer
from coati.rollout.round_generator import run_prompts
from coati.utils.actor_process import start_actor_process
from coati.utils.machine import usable_cores
from rewards.scorer import RewardScorer

MAX_PENDING = 2  # steps whose evals may be in flight at once (each holds one weight snapshot)


class Evaluator:
    """Runs as a plain (single-threaded) Ray actor: math-verify needs the main thread."""

    def __init__(self, config: RLConfig, num_threads: int | None = None):
        from coati.rollout.producer import make_backend

        start_actor_process(config.parts)
        self.config = config
        torch.set_num_threads(num_threads or usable_cores())
        torch.manual_seed(config.run.seed + 2000)  # its own stream for sampled evals
        # The seed offset keeps vLLM's sampling streams apart from every producer's.
        self.start_failure = None
        try:
            self.backend = make_backend(config, config.parallel.num_inferencers, role="evaluator",
                                        who="the evaluator")
        except EngineFailed as failure:  # raised at the first evaluation: a failed constructor prints a traceback
            self.start_failure = failure
            return
        self.scorer = RewardScorer(**config.data.scorer_options())
        self.reward_model = reward_model_scorer(config.algo.ppo.reward_model, self.backend.tokenizer,
                                                config.batch.inference_microbatch_size,
                                                config.parallel.model_placement("reward_model"))
        self.loaded = None  # (step, version) of the weights in the backend; None: the initial model
        self.env_class = load_env(config.episodes.env) if config.episodes.env else None
        self.tasks = {task: self._tokenise(path) for task, path in config.data.eval_paths.items()}

    def _tokenise(self, path: str):
        return run_prompts(self.backend.tokenizer, load_examples(path, self.config.data.rows), self.env_class,
                           self.config)

    def evaluate(self, step: int, version: int, refs: list | None, task: str, mode: str,
                 params: SamplingParams) -> dict:
        """One task and decoding mode with the weights ``refs`` ([ObjectRef] of packed tensors; None: the
        initial model, only valid before any other weights were loaded)."""
        if self.start_failure is not None:
            raise self.start_failure
        if refs is None:
            if self.loaded is not None:
                raise RuntimeError(f"evaluator asked for the initial weights after loading step {self.loaded[0]}'s")
        elif self.loaded != (step, version):
            self.backend.load_weights(unpack_named_tensors(ray.get(refs[0])))
            self.loaded = (step, version)
        examples, skipped = self.tasks[task]
        return held_out_row(self.backend, examples, skipped, params, self.scorer, version, self.reward_model,
                            self.env_class, episode_budget(self.config))
