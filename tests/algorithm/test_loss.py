"""Policy, value, SFT and reward-model losses against numbers worked out by hand (see the comments next to
every expectation)."""

import math

import pytest
import torch

from coati.algorithm.loss import (
    POLICY_LOSSES,
    VALUE_LOSSES,
    PolicyLossConfig,
    aggregate,
    batch_normaliser,
    bradley_terry_loss,
    clip_indicators,
    clip_surrogate,
    completion_nll,
    get_policy_loss,
    get_value_loss,
    kl_k1,
    kl_k3,
    register_policy_loss,
    reinforce_surrogate,
    sample_ratio,
    skip_mask,
    token_entropy,
    truncated_importance_weight,
    value_loss,
)
from coati.algorithm.policy_losses import LossInputs, policy_loss, ppo_clip_loss


def loss_of(logp, old, adv, mask, config, normaliser, ref_logprobs=None, prox_logprobs=None):
    """The registered loss ``config.objective`` of these tensors."""
    return policy_loss(LossInputs(logp, old, adv, mask, normaliser, ref_logprobs, prox_logprobs), config)


def approx(value, expected, tol=1e-5):
    return float(torch.as_tensor(value).detach()) == pytest.approx(expected, abs=tol)


# Two samples, three token slots. Old logprobs are 0, so ratio = exp(logp).
# Sample 0: A = +1, ratios (1.5, 0.5, 1.0), all valid.  Sample 1: A = -1, ratios (1.5, 0.5, -), last slot padding.
RATIOS = torch.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 1.0]])
LOGP = torch.log(RATIOS)
OLD = torch.zeros_like(LOGP)
ADV = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
DAPO_CLIP = PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.28, loss_variation="token_level")


def test_clip_surrogate_per_token_by_hand():
    loss = clip_surrogate(RATIOS, ADV, 0.2, 0.28)
    # A=+1: -min(1.5, 1.28) = -1.28 (clipped high), -min(0.5, 0.8) = -0.5, -min(1, 1) = -1
    # A=-1: -min(-1.5, -1.28) = 1.5 (not clipped), -min(-0.5, -0.8) = 0.8 (clipped low), -min(-1, -1) = 1
    assert torch.allclose(loss, torch.tensor([[-1.28, -0.5, -1.0], [1.5, 0.8, 1.0]]), atol=1e-6)


def test_clip_indicators_split_low_and_high():
    low, high = clip_indicators(RATIOS, ADV, 0.2, 0.28)
    assert high.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]  # A>0 and ratio > 1.28
    assert low.tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]  # A<0 and ratio < 0.8
    # Clip-higher is asymmetric: ratio 1.25 is clipped with eps_high 0.2 but not with 0.28.
    _, high_sym = clip_indicators(torch.tensor([[1.25]]), torch.tensor([1.0]), 0.2, 0.2)
    _, high_dapo = clip_indicators(torch.tensor([[1.25]]), torch.tensor([1.0]), 0.2, 0.28)
    assert high_sym.item() == 1.0 and high_dapo.item() == 0.0
    # Zero advantage: never clipped.
    low, high = clip_indicators(torch.tensor([[3.0, 0.1]]), torch.tensor([0.0]), 0.2, 0.2)
    assert low.sum() == 0 and high.sum() == 0


def test_policy_loss_token_level_by_hand():
    normaliser = batch_normaliser(MASK, "token_level")
    assert normaliser == 5.0
    loss, stats = loss_of(LOGP, OLD, ADV, MASK, DAPO_CLIP, normaliser)
    # (-1.28 - 0.5 - 1.0 + 1.5 + 0.8) / 5 valid tokens = -0.48 / 5
    assert approx(loss, -0.096)
    assert approx(stats["clip_fraction_high"], 1 / 5) and approx(stats["clip_fraction_low"], 1 / 5)
    assert approx(stats["clip_fraction"], 2 / 5)
    assert stats["skipped_samples"].item() == 0
    assert "kl" not in stats


def test_policy_loss_sample_level_by_hand():
    config = PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.28, loss_variation="sample_level")
    normaliser = batch_normaliser(MASK, "sample_level")
    assert normaliser == 2.0
    loss, stats = loss_of(LOGP, OLD, ADV, MASK, config, normaliser)
    # sample 0: (-1.28 - 0.5 - 1) / 3 = -0.926667; sample 1: (1.5 + 0.8) / 2 = 1.15; mean = 0.111667
    assert approx(loss, (-2.78 / 3 + 1.15) / 2)
    assert approx(stats["clip_fraction_high"], (1 / 3) / 2)  # per-sample fractions 1/3 and 0
    assert approx(stats["clip_fraction_low"], (1 / 2) / 2)  # 0 and 1/2


def test_reinforce_is_minus_advantage_times_logprob():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    adv = torch.tensor([0.5, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    per_token = reinforce_surrogate(logp, adv)
    assert per_token.tolist() == [[0.5, 1.0], [-0.5, -3.0]]
    config = PolicyLossConfig(objective="reinforce", loss_variation="token_level")
    # token_level: (0.5 + 1.0 - 0.5) / 3 valid tokens; the ratio (old logprobs) plays no part
    loss, stats = loss_of(logp, torch.full_like(logp, -7.0), adv, mask, config, 3.0)
    assert approx(loss, 1 / 3)
    assert stats["clip_fraction"].item() == 0 and stats["clip_fraction_low"].item() == 0
    loss.backward()
    # d loss / d logp = -A * mask / normaliser
    assert torch.allclose(logp.grad, torch.tensor([[-0.5 / 3, -0.5 / 3], [1 / 3, 0.0]]))
    config = PolicyLossConfig(objective="reinforce", loss_variation="sample_level")
    loss, _ = loss_of(logp.detach(), logp.detach(), adv, mask, config, 2.0)
    assert approx(loss, ((0.5 + 1.0) / 2 + (-0.5)) / 2)  # per-sample means 0.75 and -0.5


def test_kl_k3_by_hand_and_in_the_loss():
    logp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[-1.0, 0.0]])
    # log r = ref - logp = (-1, 1): exp(-1) + 1 - 1 = 0.367879; exp(1) - 1 - 1 = 0.718282
    kl = kl_k3(logp, ref)
    assert torch.allclose(kl, torch.tensor([[math.exp(-1), math.e - 2]]), atol=1e-6)
    assert kl_k3(ref, ref).abs().max() == 0  # zero at the reference
    config = PolicyLossConfig(kl_loss_coef=0.1, loss_variation="token_level")
    mask = torch.ones(1, 2)
    adv = torch.tensor([0.0])  # surrogate is zero: only the KL term remains
    loss, stats = loss_of(logp, logp, adv, mask, config, 2.0, ref_logprobs=ref)
    assert approx(stats["kl"], (math.exp(-1) + math.e - 2) / 2)
    assert approx(loss, 0.1 * (math.exp(-1) + math.e - 2) / 2)
    with pytest.raises(ValueError, match="reference logprobs"):
        loss_of(logp, logp, adv, mask, config, 2.0)


def test_sample_ratio_and_skip_threshold():
    # sample 0: ratios 30, 20 -> mean 25 > 20: skipped
    # sample 1: ratios 1, 1 -> 1
    # sample 2: ratio 50 on a padding slot, 1 on its one valid token -> 1 (padding never counts)
    # sample 3: no valid token at all -> ratio 1 by definition, never skipped
    logp = torch.log(torch.tensor([[30.0, 20.0], [1.0, 1.0], [50.0, 1.0], [99.0, 99.0]]))
    old = torch.zeros_like(logp)
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    assert torch.allclose(sample_ratio(logp, old, mask), torch.tensor([25.0, 1.0, 1.0, 1.0]))
    assert skip_mask(logp, old, mask, 20.0).tolist() == [True, False, False, False]
    assert skip_mask(logp, old, mask, 30.0).tolist() == [False, False, False, False]
    assert skip_mask(logp, old, mask, None).tolist() == [False] * 4

    adv = torch.tensor([1.0, 1.0, 1.0, 1.0])
    config = PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.2, loss_variation="token_level", skip_threshold=20.0)
    loss, stats = loss_of(logp, old, adv, mask, config, 5.0)
    assert stats["skipped_samples"].item() == 1
    # the skipped sample contributes 0 but still counts in the fixed normaliser: (-1 - 1 - 1) / 5
    assert approx(loss, -3 / 5)
    off = PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.2, loss_variation="token_level")
    loss_off, stats_off = loss_of(logp, old, adv, mask, off, 5.0)
    assert stats_off["skipped_samples"].item() == 0
    assert approx(loss_off, (-1.2 - 1.2 - 1 - 1 - 1) / 5)  # both ratios of sample 0 clipped at 1.2


def test_token_entropy_by_hand():
    # position 0: uniform over 4 tokens -> ln 4; position 1: p = (0.25, 0.75, 0, 0) -> 0.562335
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0],
                            [math.log(1.0), math.log(3.0), -1e9, -1e9],
                            [5.0, 0.0, 0.0, 0.0]]])  # the last position predicts past the row: dropped
    entropy = token_entropy(logits)
    assert entropy.shape == (1, 2)
    assert approx(entropy[0, 0], math.log(4))
    assert approx(entropy[0, 1], -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    # temperature 2 flattens [ln1, ln3] to p proportional to (1, sqrt 3)
    p = torch.tensor([1.0, math.sqrt(3)]) / (1 + math.sqrt(3))
    assert approx(token_entropy(logits, temperature=2.0)[0, 1], float(-(p * p.log()).sum()))


def test_normalisers_count_only_samples_in_the_loss():
    mask_a = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # second row masked out (e.g. truncated)
    mask_b = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert batch_normaliser(mask_a, "token_level") == 2.0
    assert batch_normaliser(mask_a, "sample_level") == 1.0
    assert batch_normaliser([mask_a, mask_b], "token_level") == 5.0  # minibatches of different widths
    assert batch_normaliser([mask_a, mask_b], "sample_level") == 3.0
    empty = torch.zeros(2, 3)
    assert batch_normaliser(empty, "token_level") == 1.0 and batch_normaliser(empty, "sample_level") == 1.0
    with pytest.raises(ValueError, match="unknown loss variation"):
        batch_normaliser(mask_a, "batch_level")


def test_fully_masked_batch_gives_zero_loss_and_zero_gradient():
    logp = torch.randn(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3)
    for variation in ("token_level", "sample_level"):
        config = PolicyLossConfig(loss_variation=variation)
        loss, stats = loss_of(logp, logp.detach(), torch.tensor([1.0, -1.0]), mask, config,
                                  batch_normaliser(mask, variation))
        assert loss.item() == 0 and stats["clip_fraction"].item() == 0
        loss.backward()
        assert logp.grad.abs().sum() == 0


@pytest.mark.parametrize("variation", ["token_level", "sample_level"])
def test_micro_batches_sum_to_the_batch_loss(variation):
    torch.manual_seed(0)
    logp, old = torch.randn(6, 5) * 0.3, torch.randn(6, 5) * 0.3
    adv = torch.randn(6)
    mask = (torch.rand(6, 5) > 0.3).float()
    config = PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.28, loss_variation=variation)
    normaliser = batch_normaliser(mask, variation)
    whole, _ = loss_of(logp, old, adv, mask, config, normaliser)
    parts = sum(loss_of(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], config, normaliser)[0]
                for i in range(0, 6, 2))
    assert torch.allclose(whole, parts, atol=1e-6)


def test_aggregate_rejects_unknown_variation_and_objective():
    with pytest.raises(ValueError):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "nope", 1.0)
    with pytest.raises(ValueError, match="unknown objective"):
        loss_of(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1),
                    PolicyLossConfig(objective="dpo"), 1.0)


# Off-policy corrections. One sample, A = +1, two valid tokens, token_level (normaliser 2).
# Behaviour (producer) probabilities 0.2, 0.3; the trainer's proximal probabilities 0.6, 0.3.
BEHAVIOUR = torch.log(torch.tensor([[0.2, 0.3]]))
PROX = torch.log(torch.tensor([[0.6, 0.3]]))
ONE = torch.tensor([[1.0, 1.0]])
DECOUPLED = PolicyLossConfig(loss_variation="token_level", correction="decoupled", tis_cap=2.0)


def test_truncated_importance_weight_by_hand():
    prox = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    behaviour = torch.log(torch.tensor([[0.2, 0.3, 0.4]]))
    weight, truncated = truncated_importance_weight(prox, behaviour, cap=2.0)
    assert torch.allclose(weight, torch.tensor([[2.0, 1.0, 0.25]]))  # 0.6/0.2 = 3 is capped at 2
    assert truncated.tolist() == [[1.0, 0.0, 0.0]]


def test_decoupled_loss_with_the_current_policy_as_proximal_by_hand():
    """One optimizer step per batch: the proximal logprobs are the loss's own, detached; ratio 1, no clip."""
    logp = PROX.clone().requires_grad_(True)
    loss, stats = loss_of(logp, BEHAVIOUR, torch.tensor([1.0]), ONE, DECOUPLED, 2.0)
    # per token -w * ratio * A = -2 * 1 and -1 * 1: (-2 - 1) / 2
    assert approx(loss, -1.5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -0.5]]))  # d/dlogp of -w*exp(logp - prox)*A / 2
    assert approx(stats["is_weight"], 1.5) and approx(stats["is_truncated"], 0.5)
    assert approx(stats["is_weight_max"], 2.0) and approx(stats["clip_fraction"], 0.0)
    # k3(prox, behaviour) on token 1: exp(-ln 3) + ln 3 - 1 = 0.431946; token 2: 0; over 2 tokens
    assert approx(stats["mismatch_k3"], 0.431946 / 2) and approx(stats["mismatch_max_abs"], math.log(3))


def test_behaviour_correction_takes_the_ratio_against_the_producer_by_hand():
    config = PolicyLossConfig(loss_variation="token_level", correction="behaviour")
    loss, stats = loss_of(PROX, BEHAVIOUR, torch.tensor([1.0]), ONE, config, 2.0)
    # ratios 3 and 1 against the behaviour policy: -min(3, 1.2) = -1.2 (clipped high), -1: (-1.2 - 1) / 2
    assert approx(loss, -1.1) and approx(stats["clip_fraction_high"], 0.5)
    assert approx(stats["is_weight"], 1.5)  # reported, not applied


def test_decoupled_loss_with_a_separate_proximal_policy_by_hand():
    """A later ppo epoch: the policy has moved to 0.9 on token 1; the ratio is against the proximal 0.6."""
    logp = torch.log(torch.tensor([[0.9, 0.3]])).requires_grad_(True)
    loss, stats = loss_of(logp, BEHAVIOUR, torch.tensor([1.0]), ONE, DECOUPLED, 2.0, prox_logprobs=PROX)
    # ratio 1.5 -> -min(1.5, 1.2) = -1.2 (clipped) * w 2 = -2.4; token 2: -1 * w 1: (-2.4 - 1) / 2
    assert approx(loss, -1.7) and approx(stats["clip_fraction_high"], 0.5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5]]))  # the clipped token has no gradient
    loss, _ = loss_of(logp, BEHAVIOUR, torch.tensor([-1.0]), ONE, DECOUPLED, 2.0, prox_logprobs=PROX)
    # A = -1: -min(-1.5, -1.2) = 1.5 (not clipped) * 2 = 3; token 2: 1 * 1: (3 + 1) / 2
    assert approx(loss, 2.0)


def test_decoupled_reinforce_weights_the_policy_gradient():
    config = PolicyLossConfig(loss_variation="token_level", objective="reinforce", correction="decoupled")
    loss, _ = loss_of(PROX, BEHAVIOUR, torch.tensor([1.0]), ONE, config, 2.0)
    # -A * logp * w: -(ln 0.6 * 2 + ln 0.3 * 1) / 2
    assert approx(loss, -(math.log(0.6) * 2 + math.log(0.3)) / 2)


def test_unknown_correction_fails():
    with pytest.raises(ValueError, match="off-policy correction"):
        loss_of(PROX, BEHAVIOUR, torch.tensor([1.0]), ONE, PolicyLossConfig(correction="nope"), 2.0)


# --- registries, the critic's value loss, SFT and reward-model losses ---

def test_policy_loss_registry_dispatches_by_name():
    assert tuple(POLICY_LOSSES) == ("ppo_clip", "reinforce", "gspo", "gspo_token", "cispo")
    assert get_policy_loss("ppo_clip") is ppo_clip_loss
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo_clip")(ppo_clip_loss)
    assert tuple(VALUE_LOSSES) == ("clipped", "mse")
    with pytest.raises(ValueError, match="unknown value loss"):
        get_value_loss("huber")


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.6]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, stats = value_loss(values, old, returns, mask, "clipped", clip_eps=0.2, normaliser=3.0)
    # token 0: (1-2)^2 = 1 vs V_clip = 0.5 + 0.2 = 0.7: (0.7-2)^2 = 1.69 -> 0.5 * 1.69 = 0.845 (clipped term)
    # token 1: (0-0)^2 = 0 vs V_clip = 0.3: 0.09 -> 0.045 (clipped term); token 2: inside the range: 0.5 * 0.16
    assert approx(loss, (0.845 + 0.045 + 0.08) / 3)
    assert approx(stats["value_clip_fraction"], 2 / 3)
    loss.backward()
    # the clipped terms hold a constant V_clip: no gradient; token 2: (V - R) / 3
    assert torch.allclose(values.grad, torch.tensor([[0.0, 0.0, -0.4 / 3]]))
    loss, stats = value_loss(values.detach(), old, returns, mask, "mse", clip_eps=0.2, normaliser=3.0)
    assert approx(loss, 0.5 * (1 + 0 + 0.16) / 3) and stats["value_clip_fraction"] == 0
    # padding never counts
    loss, _ = value_loss(values.detach(), old, returns, torch.tensor([[0.0, 0.0, 1.0]]), "clipped", 0.2, 1.0)
    assert approx(loss, 0.08)


def test_completion_nll_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # (2 + 3 + 0.5) / 3 completion tokens; the prompt and padding slots (-1, -0.5, -9) never count
    assert approx(completion_nll(logprobs, mask, 3.0), 5.5 / 3)
    halves = completion_nll(logprobs[:1], mask[:1], 3.0) + completion_nll(logprobs[1:], mask[1:], 3.0)
    assert approx(halves, 5.5 / 3)


def test_bradley_terry_loss_by_hand():
    chosen = torch.tensor([2.0, 0.0, 1.0], requires_grad=True)
    rejected = torch.tensor([1.0, 1.0, 1.0])
    loss, stats = bradley_terry_loss(chosen, rejected, normaliser=3.0)
    # differences 1, -1, 0: -log sigmoid(1) = 0.313262, -log sigmoid(-1) = 1.313262, -log sigmoid(0) = ln 2
    assert approx(loss, (0.313262 + 1.313262 + math.log(2)) / 3)
    assert approx(stats["accuracy"], 1 / 3)  # a tie is not a correct ranking
    assert approx(stats["reward_margin"], 0.0)
    loss.backward()
    # d/d r_chosen = -(1 - sigmoid(diff)) / 3
    expected = [-(1 - 1 / (1 + math.exp(-d))) / 3 for d in (1.0, -1.0, 0.0)]
    assert torch.allclose(chosen.grad, torch.tensor(expected), atol=1e-6)
    loss, _ = bradley_terry_loss(torch.tensor([2.0]), torch.tensor([1.0]), 1.0, margin=1.0)
    assert approx(loss, math.log(2))  # the margin is subtracted: -log sigmoid(0)


def test_kl_k1_is_the_log_ratio():
    assert torch.equal(kl_k1(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])), torch.tensor([0.5, -1.0]))


def _entropy_reference(logits):
    log_p = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


@pytest.mark.parametrize("chunk_bytes", [10**9, 3 * 33 * 50 * 4, 7 * 50 * 4, 1])
def test_token_entropy_in_slices_equals_it_at_once(chunk_bytes):
    # whole batch; three whole rows a slice (5 rows: a short last slice); seven positions of one row; one position
    logits = torch.randn(5, 34, 50, generator=torch.Generator().manual_seed(3)) * 3
    expected = _entropy_reference(logits).float()
    assert torch.allclose(token_entropy(logits, chunk_bytes=chunk_bytes), expected, atol=1e-5)
    bf16 = logits.bfloat16()
    assert torch.allclose(token_entropy(bf16, 0.7, chunk_bytes=chunk_bytes),
                          _entropy_reference(bf16.double() / 0.7).float(), atol=1e-5)


def test_token_entropy_holds_about_one_slice_beyond_its_output():
    from torch.distributed._tools.mem_tracker import MemTracker

    logits = torch.randn(4, 65, 4096)
    whole = logits[:, :-1].numel() * 4  # the float32 logits it reads

    def peak_bytes(chunk_bytes):
        tracker = MemTracker()
        with tracker:
            token_entropy(logits, chunk_bytes=chunk_bytes)
        # the tracker also counts the input's storage, which the slices (views of it) point to
        return tracker.get_tracker_snapshot("peak")[logits.device]["Total"] - logits.untyped_storage().nbytes()

    assert peak_bytes(10**9) > 2 * whole  # at once: log-softmax, exp and product of all of it
    assert peak_bytes(whole // 16) < 0.3 * whole  # a slice's three copies (3/16 of it) and the output
