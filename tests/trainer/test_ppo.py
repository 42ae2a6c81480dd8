"""PPO with a critic on a real trainer group (Ray actors, real buffer and weight store, gloo on localhost).

The same rollouts (reward-model scores attached, as the producers attach them) give the same policy loss,
value loss, explained variance and final weights of both the policy and the critic under FSDP2 x2 and a
ColossalAI layout as in one process; a run saved after its first step and resumed in new processes trains
the second step exactly as the uninterrupted run did (both roles' optimizer states, the adaptive KL
coefficient).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import ray
import torch

from coati.cluster.buffer import RolloutBuffer
from coati.cluster.weight_store import WeightStore
from coati.config.cli import build_parser, config_from_args
from coati.config.grpo_config import build_algo_config
from coati.config.ppo import PPOConfig
from coati.config.validate import validate
from coati.trainer.consumer import Consumer
from coati.trainer.critic_algorithm import CRITIC
from tests.plugins.equivalence import grpo_groups

G = 2
NUM_GROUPS = 8


def rollouts() -> list:
    groups = grpo_groups(vocab_size=90, pad_id=0, num_groups=NUM_GROUPS, group_size=G, seed=7)
    gen = torch.Generator().manual_seed(11)
    return [dataclasses.replace(g, scores=(2 * torch.rand(G, generator=gen) - 1).tolist()) for g in groups]


def ppo_config(model_dir: str, reward_model: str, flags: list[str], tbs: int, **ppo):
    argv = ["-m", model_dir, "-d", "unused.jsonl", "-g", str(G), "-ibs", str(NUM_GROUPS), "-imbs", str(NUM_GROUPS),
            "-tbs", str(tbs), "-tMbs", str(tbs), "-tmbs", "2", "-lr", "1e-4", "--no-progress", *flags]
    config = config_from_args(build_parser().parse_args(argv))
    algo = build_algo_config("PPO", 1e-4, 1.0, config.sampling.max_new_tokens, ppo_epochs=2,
                             ppo=PPOConfig(reward_model=reward_model, critic_learning_rate=3e-4, **ppo))
    config = dataclasses.replace(config, algo=algo)
    validate(config)
    return config


class Group:
    def __init__(self, config, groups):
        self.store = ray.remote(WeightStore).options(num_cpus=0).remote()
        self.buffer = ray.remote(RolloutBuffer).options(num_cpus=0).remote(2 * NUM_GROUPS)
        ray.get(self.buffer.put.remote(groups))
        actor = ray.remote(Consumer).options(num_cpus=1)
        self.ranks = [actor.remote(config, rank, self.buffer, self.store, 1)
                      for rank in range(config.parallel.num_trainers)]
        address, port = ray.get(self.ranks[0].rendezvous_address.remote())
        ray.get([c.setup.remote(address, port) for c in self.ranks], timeout=300)
        ray.get([c.set_total_groups.remote(NUM_GROUPS) for c in self.ranks])

    def call(self, method, *args):
        return ray.get([getattr(c, method).remote(*args) for c in self.ranks], timeout=300)

    def step(self):
        results = self.call("step")
        if results[0] is not None:
            assert len({r["loss"] for r in results}) == 1, "ranks disagree on the step's loss"
        return results[0]

    def states(self):
        return self.call("full_state")[0], self.call("full_state", CRITIC)[0]

    def close(self):
        self.call("shutdown")
        for handle in self.ranks:
            ray.kill(handle)


def train(config, steps=None, after=None):
    """(rows, policy weights, critic weights); ``after(group)`` looks into the ranks before they shut down."""
    group = Group(config, rollouts())
    try:
        rows = []
        while steps is None or len(rows) < steps:
            row = group.step()
            if row is None:
                break
            rows.append(row)
        if after is not None:
            after(group)
        return rows, *group.states()
    finally:
        group.close()


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def assert_same(reference, candidate, label, tol=1e-5):
    for ref, row in zip(reference[0], candidate[0], strict=True):
        for name in ("loss", "value_loss", "explained_variance", "kl", "rm_score"):
            assert row[name] == pytest.approx(ref[name], abs=1e-6), f"{label}: {name}"
        assert row["critic_grad_norm"] == pytest.approx(ref["critic_grad_norm"], rel=1e-5), label
    assert max_diff(candidate[1], reference[1]) <= tol, f"{label}: policy weights differ"
    assert max_diff(candidate[2], reference[2]) <= tol, f"{label}: critic weights differ"


@pytest.fixture(scope="module")
def single(local_ray, tiny_model_dir, reward_model_dir):
    return train(ppo_config(tiny_model_dir, reward_model_dir, [], tbs=4))


def test_ppo_trains_policy_and_critic(single, tiny_model_dir, reward_model_dir):
    from transformers import AutoModelForCausalLM

    from coati.trainer.critic_algorithm import load_critic

    rows, policy, critic = single
    assert len(rows) == 2 and all(r["optimizer_steps"] == 2 for r in rows)
    first = rows[0]
    # the critic starts as the reward model: its value at a response's last token is the model's score there
    assert first["values_mean"] != 0 and first["value_loss"] > 0 and first["kl_coef"] == pytest.approx(0.05)
    assert abs(first["kl"]) > 0  # behaviour logprobs are not the reference's
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert max_diff(policy, {n: p.detach() for n, p in initial.items() if n in policy}) > 0
    start = dict(load_critic(reward_model_dir).named_parameters())
    assert max_diff(critic, {n: p.detach() for n, p in start.items()}) > 0
    assert rows[1]["value_loss"] < rows[0]["value_loss"] * 1.5  # trained on its own targets, not diverging


def test_critic_starts_from_the_reward_model_head(reward_model_dir):
    """The token-classification critic reads the reward model's head unchanged: at the last real token its
    value is the reward model's score of the sequence."""
    from transformers import AutoModelForSequenceClassification

    from coati.trainer.critic_algorithm import critic_values, load_critic

    ids = torch.tensor([[5, 9, 12, 30, 7]])
    rm = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    critic = load_critic(reward_model_dir).eval()
    with torch.no_grad():
        score = rm(input_ids=ids).logits[0, 0]
        values = critic(input_ids=ids).logits
    assert values.shape == (1, 5, 1) and critic_values(values).shape == (1, 4)
    assert float(values[0, -1, 0]) == pytest.approx(float(score), abs=1e-5)


@pytest.mark.e2e
def test_ppo_over_fsdp2_matches_single_process_on_one_trainer_mesh(single, tiny_model_dir, reward_model_dir):
    """FSDP2 x2 (zero 2) trains policy and critic as one process does; and PPO builds the trainer mesh once per
    group: both roles' plugins get it, and FSDP2 shards both models over the same data-parallel process group (not
    one set of sub-groups per role)."""
    critic_name, found = CRITIC, []

    def role_meshes(consumer) -> dict:  # runs inside each rank (a local function: Ray pickles it by value)
        actor, critic = (consumer.roles[name].plugin for name in ("actor", critic_name))
        actor_param, critic_param = next(actor.module.parameters()), next(critic.module.parameters())
        return {"one_mesh": actor.mesh is consumer.mesh and critic.mesh is consumer.mesh,
                "one_group": actor_param.device_mesh.get_group() is critic_param.device_mesh.get_group(),
                "coords": (consumer.mesh.rank, consumer.mesh.dp_rank, consumer.mesh.dp_size)}

    def inspect(group) -> None:
        found.extend(ray.get([rank.__ray_call__.remote(role_meshes) for rank in group.ranks], timeout=120))

    config = ppo_config(tiny_model_dir, reward_model_dir, ["-t", "2", "-zero", "2"], tbs=2)
    assert_same(single, train(config, after=inspect), "torch FSDP2 x2 (zero 2)")
    assert [f["coords"] for f in found] == [(0, 0, 2), (1, 1, 2)]
    assert all(f["one_mesh"] and f["one_group"] for f in found), found


@pytest.mark.e2e
def test_ppo_over_colossalai_lowlevelzero_matches_single_process(single, tiny_model_dir, reward_model_dir):
    pytest.importorskip("colossalai", reason="ColossalAI not installed (bash scripts/install_colossalai.sh .venv)")
    flags = ["-t", "2", "--plugin", "colossalai", "-zero", "1"]
    assert_same(single, train(ppo_config(tiny_model_dir, reward_model_dir, flags, tbs=2)), "colossalai LowLevelZero-1 x2")


@pytest.mark.e2e
def test_ppo_resume_is_exact(local_ray, tiny_model_dir, reward_model_dir, tmp_path):
    """Adaptive KL on (beta moves every step): a checkpoint after step 1, loaded by new processes, gives step 2
    of the uninterrupted run: both roles' weights and optimizer states and beta come back."""
    config = ppo_config(tiny_model_dir, reward_model_dir, [], tbs=4, kl_target=0.01, kl_horizon=100)
    reference = train(config)
    assert reference[0][1]["kl_coef"] != reference[0][0]["kl_coef"]
    first = Group(config, rollouts())
    try:
        first.step()
        staging = str(tmp_path / "step_1")
        first.call("save_checkpoint", staging)
    finally:
        first.close()
    assert os.path.isdir(os.path.join(staging, "trainer_state", "actor"))
    assert os.path.isdir(os.path.join(staging, "trainer_state", CRITIC))
    second = Group(config, [])  # step 1 drew the whole round; its second part is in the checkpoint
    try:
        second.call("load_checkpoint", staging)
        row = second.step()
        policy, critic = second.states()
    finally:
        second.close()
    ref_row = reference[0][1]
    for name in ("loss", "value_loss", "kl_coef", "explained_variance"):
        assert row[name] == pytest.approx(ref_row[name], abs=1e-7), name
    assert max_diff(policy, reference[1]) == 0.0 and max_diff(critic, reference[2]) == 0.0
