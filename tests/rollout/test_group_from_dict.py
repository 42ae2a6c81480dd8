"""Groups saved by older builds (pending groups in a checkpoint) still load."""

from dataclasses import asdict

from coati.rollout.group import RolloutGroup


def test_from_dict_ignores_the_producer_advantages_of_older_checkpoints():
    group = RolloutGroup(prompt_ids=[1], responses=[[2], [3]], logprobs=[[-0.5], [-0.7]], rewards=[1.0, 0.0],
                         correct=[True, False], format_ok=[True, True], finish_reasons=["stop", "length"],
                         policy_version=3)
    row = {**asdict(group), "advantages": [0.7071, -0.7071]}
    assert RolloutGroup.from_dict(row) == group
    assert not hasattr(RolloutGroup.from_dict(row), "advantages")
