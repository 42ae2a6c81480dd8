"""Episode metrics, rollout-log turns, and length logic that counts only the model's tokens."""

import torch

from coati.rollout.episode_metrics import episode_metrics
from coati.rollout.group import RolloutGroup
from coati.rollout.rollout_log import rollout_records
from coati.trainer.group_algorithm import shaped_group_tensors
from coati.algorithm.advantage import overlong_penalty


def _group(turns=None, loss_masks=None, responses=None, rewards=(1.0, 0.0)):
    responses = responses or [[1] * 6, [1] * 4]
    return RolloutGroup(prompt_ids=[3], responses=responses, logprobs=[[0.0] * len(r) for r in responses],
                        rewards=list(rewards), correct=[r > 0 for r in rewards],
                        format_ok=[True, True], finish_reasons=["stop", "stop"], policy_version=2,
                        texts=["a", "b"], loss_masks=loss_masks or [], turns=turns or [])


def test_metrics_from_turns():
    turns = [[{"model": "x", "tool_call": "python", "tool_error": True}, {"model": "y", "tool_call": "python",
              "tool_timeout": True, "tool_error": True}, {"model": "z"}], [{"model": "w"}]]
    group = _group(turns, [[1, 0, 0, 1, 0, 1], [1, 1, 1, 1]])
    m = episode_metrics([group])
    assert m["episode_turns"] == 2.0 and m["tool_calls"] == 1.0 and m["tool_use_rate"] == 0.5
    assert m["tool_error_rate"] == 1.0 and m["tool_timeout_rate"] == 0.5
    assert m["tool_token_fraction"] == 3 / 10
    assert m["reward_calls_2plus"] == 1.0 and m["reward_calls_0"] == 0.0 and "reward_calls_1" not in m
    assert episode_metrics([_group()]) == {}  # single-turn groups add nothing


def test_rollout_log_shows_turns():
    turns = [[{"model": "x", "tool_call": "python"}, {"model": "z"}], [{"model": "w"}]]
    group = _group(turns, [[1, 0, 0, 1, 0, 1], [1, 1, 1, 1]])
    zeros = torch.zeros(1, 2)
    records = rollout_records(5, [group], [group], zeros, zeros, torch.ones(1, 2))
    assert records[0]["turns"] == turns[0] and records[0]["model_tokens"] == 3 and records[1]["model_tokens"] == 4
    assert "turns" not in rollout_records(5, [_group()], [_group()], zeros, zeros, torch.ones(1, 2))[0]


def test_overlong_punishment_counts_model_tokens_only():
    class Groups:
        soft_over_length_punishment, cache_length, advantage = True, 2, "group_norm"
        filter_truncated_response, topk_samples, filter_range = False, None, None

    long_tools = _group(loss_masks=[[1, 0, 0, 0, 0, 1], [1, 1, 1, 1]], rewards=(0.0, 0.0))
    shaped, _, _ = shaped_group_tensors([long_tools], Groups, max_new_tokens=4)
    expected = overlong_penalty(torch.tensor([2.0, 4.0]), 4, 2)
    torch.testing.assert_close(shaped[0], expected)
    assert shaped[0, 0] == 0.0  # 6 tokens, but only 2 the model's: no penalty
