"""Pure pieces of the losses: the policy losses' shared helpers, the value, SFT and reward-model losses.

Per-token tensors are [batch, T] with a 0/1 ``mask`` of valid tokens. The registered policy losses themselves,
each one whole function written over these helpers, are policy_losses.py.

Aggregations (``PolicyLossConfig.loss_variation``; rows of ``coati.algorithm.registry.LOSS_AGGREGATIONS``)
reduce per-token losses to a micro-batch's share of the (mini)batch loss. Micro-batching is exact: each takes
the ``normaliser`` of the whole (mini)batch (its row's normaliser function, from every sample's valid-token
count), so summing the losses of micro-batches gives the loss of the batch, and so do the gradients.
- ``token_level`` (verl token-mean): sum of token losses / valid tokens of the batch.
- ``sample_level`` (seq-mean-token-mean): per-sample mean over its tokens, summed / samples with a valid token.
- ``sample_sum`` (seq-mean-token-sum): per-sample sum over its tokens, summed / samples with a valid token.
- ``sample_sum_norm`` (Dr.GRPO; verl seq-mean-token-sum-norm, TRL ``loss_type="dr_grpo"``): sum of token
  losses / (samples of the batch x L_max), a constant for a given batch size, whatever the lengths.
The loss's statistics are aggregated like the loss, so under the two sums they are per-sample sums and per
token slot (samples x L_max) rather than means over tokens.

KL estimators of KL(pi || ref) per token (rows of ``KL_ESTIMATORS``): ``k1`` logp - ref, ``k2``
0.5 (logp - ref)^2, ``k3`` exp(ref - logp) - (ref - logp) - 1.

Value losses (PPO's critic) are a registry too (``@register_value_loss``): ``clipped``
0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip = V_old + clip(V - V_old, -eps, eps), and ``mse`` 0.5 (V - R)^2.
The supervised stages' losses live here as well: ``completion_nll`` (SFT) and ``bradley_terry_loss`` (reward model).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from coati.algorithm.loss_config import CORRECTIONS, PolicyLossConfig  # noqa: F401
from coati.algorithm.registry import (  # noqa: F401  (the registries' API, also reachable from here)
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    get_kl_estimator,
    get_loss_aggregation,
    get_policy_loss,
    register_policy_loss,
)
from coati.utils.user_parts import registrar

# Statistics that are maxima over the step (not sums over micro-batches, not means over ranks).
MAX_STATS = ("is_weight_max", "mismatch_max_abs", "delivery_gap")

# name -> fn(values, old_values, returns, clip_eps) -> (per-token loss, clipped indicator)
VALUE_LOSSES: dict[str, Callable] = {}


def register_value_loss(name: str):
    """Decorator: make ``fn`` the value loss called ``name``."""
    return registrar(VALUE_LOSSES, "value loss", f"{__name__}:VALUE_LOSSES")(name)


def get_value_loss(name: str) -> Callable:
    if name not in VALUE_LOSSES:
        raise ValueError(f"unknown value loss {name!r}; choose one of {tuple(VALUE_LOSSES)}")
    return VALUE_LOSSES[name]


# --- KL estimators ---

def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimator of KL(pi || ref): logp - ref (unbiased, may be negative; the usual choice for
    the KL-in-reward penalty of RLHF-PPO)."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k2 estimator of KL(pi || ref): 0.5 (logp - ref)^2 (biased, low variance, >= 0)."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1, always >= 0."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


# --- ratios, surrogates and where their clip binds ---

def token_ratio(logprobs: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Per-token importance ratio exp(logp - anchor)."""
    return torch.exp(logprobs - anchor)


def sequence_log_ratio(logprobs: torch.Tensor, anchor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[batch, 1] log of GSPO's sequence ratio (pi(y) / pi_anchor(y))^(1/|y|): the mean of logp - anchor over a
    sample's valid tokens (0 for a sample without one)."""
    mask = mask.to(logprobs.dtype)
    return ((logprobs - anchor) * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)


def _per_sample(advantages: torch.Tensor) -> torch.Tensor:
    """[batch] advantages as a [batch, 1] column that broadcasts over tokens; [batch, T] ones unchanged."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def clip_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """PPO's clipped objective to *minimise*: -min(ratio A, clip(ratio, 1 - eps_low, 1 + eps_high) A), over any
    ratio (per token, or GSPO's per sequence: [batch, 1]); ``advantages`` [batch] or [batch, T]."""
    advantages = _per_sample(advantages)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    return -torch.minimum(unclipped, clipped)


def clip_indicators(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float):
    """0/1 tensors (low, high): where the clip actually binds in ``clip_surrogate``.

    low: A < 0 and ratio < 1 - eps_low (the objective stops rewarding pushing a bad token down);
    high: A > 0 and ratio > 1 + eps_high (it stops rewarding pushing a good token up). Where either is set
    the clipped term is the smaller one, and the token has no gradient.
    """
    advantages = _per_sample(advantages)
    low = (advantages < 0) & (ratio < 1.0 - eps_low)
    high = (advantages > 0) & (ratio > 1.0 + eps_high)
    return low.float(), high.float()


def reinforce_surrogate(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Vanilla policy gradient: per-token -A * logp (to minimise)."""
    return -_per_sample(advantages) * logprobs


def clipped_weight(ratio: torch.Tensor, eps_low: float, eps_high: float):
    """CISPO's importance weight clip(ratio, 1 - eps_low, 1 + eps_high), detached, and 0/1 (low, high): where
    either bound binds, whatever the advantage's sign (the weight scales the gradient either way)."""
    ratio = ratio.detach()
    return (ratio.clamp(1.0 - eps_low, 1.0 + eps_high), (ratio < 1.0 - eps_low).float(),
            (ratio > 1.0 + eps_high).float())


def sample_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[batch] importance ratio per sample: mean of exp(logp - old_logp) over its valid tokens (1 if none)."""
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs) * mask
    count = mask.sum(dim=1)
    return torch.where(count > 0, ratio.sum(dim=1) / count.clamp(min=1.0), torch.ones_like(count))


def skip_mask(logprobs, old_logprobs, mask, threshold: float | None) -> torch.Tensor:
    """[batch] bool: samples with at least one valid token whose ``sample_ratio`` exceeds ``threshold``."""
    if threshold is None:
        return torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    has_tokens = mask.sum(dim=1) > 0
    return has_tokens & (sample_ratio(logprobs.detach(), old_logprobs, mask) > threshold)


def truncated_importance_weight(prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                                cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token (min(exp(prox - behaviour), cap), 1 where the cap binds); no gradient flows through either."""
    ratio = torch.exp(prox_logprobs.detach() - behaviour_logprobs.detach())
    return ratio.clamp(max=cap), (ratio > cap).to(ratio.dtype)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Largest of ``values`` where ``mask`` is set (0 when nothing is)."""
    masked = torch.where(mask > 0, values, torch.full_like(values, float("-inf")))
    return masked.max().clamp(min=0.0) if mask.any() else values.new_zeros(())


# --- aggregations (rows of LOSS_AGGREGATIONS: a reduction and its normaliser) ---

def masked_sum(per_token: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """Sum of the valid tokens' values / ``normaliser``."""
    return (per_token * mask).sum() / normaliser


def sample_means_sum(per_token: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """Each sample's mean over its valid tokens, summed / ``normaliser``."""
    per_sample = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_sample.sum() / normaliser


def count_tokens(valid_tokens: torch.Tensor, max_length: int | None) -> float:
    """The batch's valid tokens (at least 1)."""
    return max(float(valid_tokens.sum()), 1.0)


def count_samples(valid_tokens: torch.Tensor, max_length: int | None) -> float:
    """The batch's samples with a valid token (at least 1): one masked out entirely, e.g. a truncated response
    under filter_truncated_response, does not count."""
    return max(float((valid_tokens > 0).sum()), 1.0)


def count_token_slots(valid_tokens: torch.Tensor, max_length: int | None) -> float:
    """Dr.GRPO's constant: every sample of the batch (masked or not) times L_max, the longest a response may be."""
    if max_length is None:
        raise ValueError("the sample_sum_norm aggregation needs the longest response length (L_max)")
    return max(float(valid_tokens.numel() * max_length), 1.0)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, variation: str, normaliser: float) -> torch.Tensor:
    """Reduce per-token values to this micro-batch's share of the batch loss (module docstring)."""
    return get_loss_aggregation(variation).fn(per_token, mask.to(per_token.dtype), normaliser)


def batch_normaliser(mask: torch.Tensor | list[torch.Tensor], variation: str, max_length: int | None = None) -> float:
    """The denominator ``aggregate`` needs for a whole batch whose valid-token mask is ``mask`` (at least 1).

    ``mask`` may be a list of the masks of a batch's minibatches (their widths may differ); ``max_length``:
    L_max, for the aggregations whose normaliser is a constant (``sample_sum_norm``).
    """
    masks = mask if isinstance(mask, (list, tuple)) else [mask]
    return normaliser_from_counts(torch.cat([m.sum(dim=1).reshape(-1) for m in masks]), variation, max_length)


def normaliser_from_counts(valid_tokens: torch.Tensor, variation: str, max_length: int | None = None) -> float:
    """``batch_normaliser`` from the number of valid tokens of every sample of the batch."""
    return get_loss_aggregation(variation).normaliser_fn(valid_tokens, max_length)


ENTROPY_CHUNK_BYTES = 64 * 2**20  # float32 logits per slice of token_entropy's work


def token_entropy(logits: torch.Tensor, temperature: float = 1.0,
                  chunk_bytes: int = ENTROPY_CHUNK_BYTES) -> torch.Tensor:
    """Entropy of the next-token distribution at every position of ``logits[:, :-1]``: shape [B, L-1]; of logits
    of scored positions only ([T, V]: coati.algorithm.batch.scored_positions), shape [T].

    Aligned with ``token_logprobs`` (and so with ``action_mask``); computed in float32, no gradient. It is a
    metric taken beside the loss, so it works through the logits a slice of about ``chunk_bytes`` (as float32)
    at a time: done at once, its float32 copy, log-softmax, exp and product would be four more copies of the
    logits at the forward's peak (measured: 2-2.5x the float32 logits above what the loss itself holds), the
    largest tensors of a step at real vocabulary sizes.
    """
    scored = logits.dim() == 2
    grid = logits.unsqueeze(0) if scored else logits[:, :-1]
    rows, positions, vocab = grid.shape
    out = torch.empty(rows, positions, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for row_slice, position_slice in _entropy_slices(rows, positions, 4 * vocab, chunk_bytes):
            piece = grid[row_slice, position_slice].float()
            if temperature != 1.0:
                piece = piece / temperature
            log_p = torch.log_softmax(piece, dim=-1)
            out[row_slice, position_slice] = -(log_p.exp() * log_p).sum(dim=-1)
    return out[0] if scored else out


def _entropy_slices(rows: int, positions: int, position_bytes: int, chunk_bytes: int):
    """(rows, positions) slices covering a [rows, positions] grid, each about ``chunk_bytes`` of
    ``position_bytes`` each: whole rows when a row fits, else parts of one row."""
    row_bytes = positions * position_bytes
    if row_bytes <= chunk_bytes:
        step = max(1, chunk_bytes // max(row_bytes, 1))
        return [(slice(r, r + step), slice(0, positions)) for r in range(0, rows, step)]
    step = max(1, chunk_bytes // position_bytes)
    return [(slice(r, r + 1), slice(p, min(p + step, positions)))
            for r in range(rows) for p in range(0, positions, step)]


@register_value_loss("clipped")
def clipped_value_loss(values, old_values, returns, clip_eps: float):
    """Per token 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -eps, eps) (PPO's
    value clipping: the critic cannot gain by moving further than eps from the rollout's values); and 1
    where the clipped term is the larger."""
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    unclipped_sq, clipped_sq = (values - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_sq, clipped_sq), (clipped_sq > unclipped_sq).float()


@register_value_loss("mse")
def mse_value_loss(values, old_values, returns, clip_eps: float):
    """Per token 0.5 * (V - R)^2 (no clipping)."""
    return 0.5 * (values - returns) ** 2, torch.zeros_like(values)


def value_loss(values, old_values, returns, mask, name: str, clip_eps: float, normaliser: float,
               variation: str = "token_level") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critic's loss of one micro-batch (``aggregate``d like the policy loss) and detached statistics."""
    per_token, clipped = get_value_loss(name)(values, old_values, returns, clip_eps)
    loss = aggregate(per_token, mask, variation, normaliser)
    return loss, {"value_loss": loss.detach(), "value_clip_fraction": aggregate(clipped, mask, variation, normaliser)}


def completion_nll(logprobs: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """SFT: the summed negative log-likelihood of the completion tokens (``mask``) / ``normaliser`` (the
    step's completion tokens, so micro-batches and data-parallel ranks add up to the per-token mean)."""
    return -(logprobs * mask.to(logprobs.dtype)).sum() / normaliser


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, normaliser: float,
                       margin: torch.Tensor | float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model loss: sum over pairs of -log sigmoid(r_chosen - r_rejected - margin) / ``normaliser``
    (the step's pairs), and detached statistics on the same scale: accuracy (a pair counts when r_chosen >
    r_rejected; a tie does not) and the mean margin r_chosen - r_rejected."""
    diff = chosen.float() - rejected.float()
    loss = -F.logsigmoid(diff - margin).sum() / normaliser
    return loss, {"loss": loss.detach(), "accuracy": (diff > 0).float().sum() / normaliser,
                  "reward_margin": diff.detach().sum() / normaliser}
