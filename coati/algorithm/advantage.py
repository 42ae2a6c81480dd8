"""Pure functions on rewards: advantage estimators (a registry chosen by name), group filters, reward shaping,
sample selection, and the token-level RLHF pieces (KL-in-reward, GAE, returns, whitening).

No I/O, no state. Group rewards are [groups, G] tensors (one row per prompt, G completions each); token-level
tensors are [batch, T] with a 0/1 ``mask`` of the response tokens (aligned with ``token_logprobs``).

Advantage estimators are chosen by name: the shipped ones are rows of ``coati.algorithm.registry``
(``@register_adv_est("name", inputs=...)`` adds one at run time); a config names
one (``--grpo-config advantage``) and the trainer calls ``get_adv_estimator(name)``. ``inputs`` says what an
estimator reads: ``"group"`` ones take the [groups, G] rewards of a rollout batch (GRPO, DAPO, PG);
``"batch"`` ones the [groups, G] rewards and response lengths of the whole batch, which they normalise over
(REINFORCE++); ``"token_values"`` ones take per-token rewards and a critic's values (PPO) and return
(advantages, returns).
"""

from __future__ import annotations

import torch

from coati.algorithm.registry import (  # noqa: F401  (the registry's API, also reachable from here)
    ADV_ESTIMATORS,
    ESTIMATOR_INPUTS,
    AdvEstimator,
    adv_estimator_names,
    get_adv_estimator,
    register_adv_est,
)

ADVANTAGE_EPS = 1e-6
WHITEN_EPS = 1e-8
def _check_groups(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, G], got shape {tuple(rewards.shape)}")


def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """GRPO advantages for rewards of shape [groups, G]: (r - group mean) / (group std + eps).

    The std is the unbiased sample std (as in the GRPO paper's reference code); a group whose rewards are
    all equal gets zero advantage everywhere, so it contributes no policy gradient.
    """
    _check_groups(rewards)
    rewards = rewards.float()
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


def group_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a group-mean baseline (PG): r - group mean, not scaled."""
    _check_groups(rewards)
    rewards = rewards.float()
    return rewards - rewards.mean(dim=1, keepdim=True)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): each sample's baseline is the mean reward of the other G - 1 samples of its
    group, A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) * (r_i - group mean); not scaled by a std."""
    _check_groups(rewards)
    count = rewards.shape[1]
    if count < 2:
        raise ValueError(f"rloo needs at least 2 samples per group (a leave-one-out baseline), got G={count}")
    rewards = rewards.float()
    return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (count - 1)


def whiten_over_tokens(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-response ``values`` whitened over the batch's response tokens: each response counts once per token it
    has (``lengths``), as whitening per-token copies of its value would (verl's masked_whiten): weighted mean,
    Bessel-corrected variance over the tokens (0 below two tokens), (v - mean) / sqrt(var + 1e-8)."""
    weights = lengths.to(values.dtype)
    return (values - masked_mean(values, weights)) * torch.rsqrt(masked_var(values, weights) + WHITEN_EPS)


def reinforce_pp_advantages(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ (Hu 2025) on outcome rewards: no per-prompt baseline, the rewards normalised over the whole
    batch's tokens (``whiten_over_tokens``). With the reward on a response's last token and gamma = 1 every token's
    return is the response's reward, so this is verl's ``reinforce_plus_plus`` per response."""
    _check_groups(rewards)
    return whiten_over_tokens(rewards.float(), lengths)


def reinforce_pp_baseline_advantages(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline: each reward minus its group's mean (a group of one keeps its reward, as verl's
    ``reinforce_plus_plus_baseline``), then normalised over the whole batch's tokens (``whiten_over_tokens``)."""
    _check_groups(rewards)
    rewards = rewards.float()
    centred = rewards - rewards.mean(dim=1, keepdim=True) if rewards.shape[1] > 1 else rewards
    return whiten_over_tokens(centred, lengths)


def compute_advantages(rewards: torch.Tensor, kind: str, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """[groups, G] advantages of the group-family estimator ``kind``; ``lengths`` [groups, G] (response tokens)
    for the estimators that read the whole batch."""
    estimator = get_adv_estimator(kind)
    if estimator.inputs == "token_values":
        raise ValueError(f"advantage {kind!r} needs per-token rewards and a critic's values, not group rewards")
    if estimator.inputs == "batch":
        if lengths is None:
            raise ValueError(f"advantage {kind!r} normalises over the batch's tokens: it needs the response lengths")
        return estimator.fn(rewards, lengths)
    return estimator.fn(rewards)


def group_accuracy_in_range(correct: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Mask over groups whose accuracy (mean of ``correct`` over G) lies within [low, high]."""
    accuracy = correct.float().mean(dim=1)
    return (accuracy >= low) & (accuracy <= high)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, cache_length: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13) per response length |y| (tokens, EOS included).

    With L_max = ``max_new_tokens`` and L_cache = ``cache_length``:
    0 when |y| <= L_max - L_cache; (L_max - L_cache - |y|) / L_cache inside the cache window
    (L_max - L_cache < |y| <= L_max), falling linearly to -1 at L_max; -1 beyond L_max.
    """
    if not 0 < cache_length <= max_new_tokens:
        raise ValueError(f"cache_length must lie in [1, max_new_tokens={max_new_tokens}], got {cache_length}")
    lengths = lengths.float()
    expected = float(max_new_tokens - cache_length)
    window = (expected - lengths) / cache_length
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), window)
    return torch.where(lengths > max_new_tokens, torch.full_like(lengths, -1.0), penalty)


def topk_sample_mask(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """[groups, G] bool: the ``k`` highest rewards of every group; among equal rewards the lower index wins."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, G], got shape {tuple(rewards.shape)}")
    if not 1 <= k <= rewards.shape[1]:
        raise ValueError(f"k must lie in [1, G={rewards.shape[1]}], got {k}")
    order = torch.sort(rewards.float(), dim=1, descending=True, stable=True).indices[:, :k]
    mask = torch.zeros(rewards.shape, dtype=torch.bool)
    return mask.scatter(1, order, True)


def sample_loss_mask(truncated: torch.Tensor, rewards: torch.Tensor, filter_truncated: bool,
                     topk: int | None) -> torch.Tensor:
    """[groups, G] float 0/1: which samples enter the loss.

    ``filter_truncated`` drops responses that hit max_new_tokens without EOS (``truncated`` True);
    ``topk`` keeps only the k highest-reward samples per group (chosen before the truncation filter, so a
    group keeps at most k samples). Advantages are computed on the whole group either way.
    """
    keep = torch.ones(rewards.shape, dtype=torch.bool)
    if topk is not None:
        keep &= topk_sample_mask(rewards, topk)
    if filter_truncated:
        keep &= ~truncated.bool()
    return keep.float()


# --- token-level RLHF (PPO with a critic and a reward model) ---

def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """[batch] index of the last position where ``mask`` is set (-1 for a row with none)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values


def kl_penalised_rewards(kl: torch.Tensor, mask: torch.Tensor, scores: torch.Tensor, beta: float,
                         score_clip: float | None = None) -> torch.Tensor:
    """Per-token rewards of RLHF-PPO: -beta * KL_t on every response token, plus the sequence's score (the
    reward model's, optionally with a verifiable reward added by the caller), clamped to [-clip, clip], on
    its last response token. ``kl`` [batch, T] is the per-token KL estimate to the reference (e.g.
    logp - ref_logp); ``scores`` [batch]. A row without a response token gets nothing."""
    mask = mask.to(kl.dtype)
    rewards = -beta * kl * mask
    if score_clip is not None:
        scores = scores.clamp(-score_clip, score_clip)
    last = last_token_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] += scores[rows].to(rewards.dtype)
    return rewards


def _backward_scan(mask: torch.Tensor, step) -> None:
    """Visit the positions of every row from last to first; masked positions are skipped (``step`` is not
    called), so a gap in a response (e.g. tool output inside a turn) is transparent to the recursion."""
    for t in range(mask.shape[1] - 1, -1, -1):
        step(t, mask[:, t] > 0)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens: (advantages, returns), both [batch, T].

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where t+1 is the next
    *response* token (0 after the last one: the episode ends there); returns R_t = A_t + V_t (the critic's
    target). Positions outside ``mask`` are 0 in both.
    """
    rewards, values, mask = rewards.float(), values.float().detach(), mask.float()
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], device=rewards.device)
    next_adv = torch.zeros_like(next_value)

    def step(t, valid):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(valid, adv, torch.zeros_like(adv))
        next_value.copy_(torch.where(valid, values[:, t], next_value))
        next_adv.copy_(torch.where(valid, adv, next_adv))

    _backward_scan(mask, step)
    return advantages, (advantages + values) * mask


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """[batch, T] reward-to-go G_t = r_t + gamma * G_{t+1} over response tokens (0 outside ``mask``)."""
    rewards, mask = rewards.float(), mask.float()
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], device=rewards.device)

    def step(t, valid):
        value = rewards[:, t] + gamma * running
        returns[:, t] = torch.where(valid, value, torch.zeros_like(value))
        running.copy_(torch.where(valid, value, running))

    _backward_scan(mask, step)
    return returns


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` where ``mask`` is set (Bessel-corrected by default; 0 with fewer than 2)."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_mean(values, mask)
    total = (((values - mean) ** 2) * mask).sum()
    if count < 2:
        return total * 0
    return total / (count - 1) if unbiased else total / count


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = WHITEN_EPS) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries (the batch's, not per row); ``shift_mean`` False
    adds the mean back (only the scale changes). Entries outside ``mask`` are 0."""
    mask = mask.to(values.dtype)
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask
