"""Your own parts, for every process of a run: `coati train --plugins examples/parts/my_parts.py --grpo-config
'{"objective": "my_clip"}'` (docs/algorithms.md#your-own-parts-in-every-process).

The driver, the producers, the trainer ranks and the evaluator each import this file before they build anything,
so the names below are usable wherever a registered name is: ``objective``, ``advantage`` (``--grpo-config``),
``--env`` (the producers' and the evaluator's episodes)."""

from coati.algorithm.registry import get_policy_loss, register_adv_est, register_policy_loss
from coati.rollout.env import Environment, StepResult, boxed_answer, register_env


@register_policy_loss("my_clip")
def my_clip(inputs, config):
    """PPO's clipped loss, and a statistic of its own: the tokens it saw (metrics.jsonl shows ``my_clip_tokens``)."""
    loss, stats = get_policy_loss("ppo_clip")(inputs, config)
    stats["my_clip_tokens"] = inputs.mask.sum()
    return loss, stats


@register_adv_est("centred")
def centred(rewards):
    """Each reward minus its group's mean (rewards: [groups, G])."""
    return rewards - rewards.mean(dim=1, keepdim=True)


@register_env("boxed_once")
class BoxedOnce(Environment):
    """A one-turn episode (``--env boxed_once``): 1 when the answer's last \\boxed{} is the row's answer, else 0."""

    def reset(self, row):
        self.row = row

    def step(self, model_text):
        return StepResult(reward=float(boxed_answer(model_text) == str(self.row.label)), done=True)
