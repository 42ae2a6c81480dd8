"""The presets and registry rows added with issue 42 (GSPO, GSPO-token, CISPO, Dr.GRPO, REINFORCE++) reach a real
``Consumer`` (tiny random model, single-process plugin, the simulated producer side of test_dapo_e2e.py) and
train; REINFORCE++'s batch normalisation covers every data-parallel rank's groups."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from coati.algorithm.advantage import compute_advantages
from coati.trainer.group_algorithm import GroupAlgorithm, group_tensors
from coati.trainer.step_data import share_bounds
from tests.trainer.test_dapo_e2e import G, build, make_group, run_all, tiny_dir  # noqa: F401 (a fixture)


@pytest.mark.parametrize("flags, objective", [
    (["-a", "GSPO"], "gspo"), (["-a", "CISPO"], "cispo"), (["-a", "DrGRPO"], "ppo_clip"),
    (["--grpo-config", json.dumps({"objective": "gspo_token", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4})],
     "gspo_token"),
    (["--grpo-config", json.dumps({"advantage": "reinforce_plus_plus"})], "ppo_clip"),
    (["--grpo-config", json.dumps({"advantage": "reinforce_plus_plus_baseline", "kl_estimator": "k2"}), "-kl", "0.05"],
     "ppo_clip"),
])
def test_each_new_row_trains_in_the_consumer(tiny_dir, monkeypatch, flags, objective):
    consumer, _, _ = build(tiny_dir, monkeypatch, [1, 2, 3], 1, *flags, "-lr", "1e-2")
    assert consumer.config.algo.loss.objective == objective
    rows = run_all(consumer)
    assert len(rows) == 2 and all(math.isfinite(row["loss"]) and row["grad_norm"] > 0 for row in rows)
    assert all("clip_fraction" in row and "is_weight" in row for row in rows)


@pytest.mark.parametrize("rank", [0, 1])
def test_reinforce_plus_plus_normalises_over_every_rank_of_the_step(tiny_dir, monkeypatch, rank):
    """Whole groups per step on 2 data-parallel ranks: each rank's advantages are its rows of the advantages of
    the step's 5 groups together (rank 1 also pads with a copy of group 0), not of its own share alone."""
    consumer, _, _ = build(tiny_dir, monkeypatch, [1, 2, 3], 1, "--grpo-config",
                           json.dumps({"advantage": "reinforce_plus_plus"}))
    algorithm = GroupAlgorithm.__new__(GroupAlgorithm)
    algorithm.context = SimpleNamespace(dp_size=2, dp_rank=rank, pad_id=consumer.pad_id)
    algorithm.config, algorithm.groups_config = consumer.config, consumer.config.algo.groups
    algorithm.objective = SimpleNamespace(reference=None)
    kept = [make_group(correct, 0) for correct in (1, 2, 3, 4, 0)]
    for index, group in enumerate(kept):  # lengths differ, so the token weights matter
        group.responses = [response[: 2 + (index + i) % 4] for i, response in enumerate(group.responses)]
        group.logprobs = [[-1.0] * len(response) for response in group.responses]
    start, end = share_bounds(len(kept), 2, rank)
    padding = 3 - (end - start)
    share = kept[start:end] + [kept[0]] * padding
    batches = algorithm.build_batches(share, kept, padding)
    data = group_tensors(kept)
    whole = compute_advantages(data.rewards, "reinforce_plus_plus", data.lengths)
    mine = torch.cat([batch["advantages"] for batch in batches])
    want = torch.cat([whole[start:end].reshape(-1), whole[0].repeat(padding)])
    assert torch.equal(mine, want)
    alone = compute_advantages(data.rewards[start:end], "reinforce_plus_plus", data.lengths[start:end])
    assert not torch.allclose(mine[: (end - start) * G], alone.reshape(-1))
