"""Start-up checks of the algorithm's settings: -a, --grpo-config, the loss and PPO's flags, and which options
belong to which kind of algorithm (a critic's, -a PPO; or group advantages, -a GRPO/DAPO/PG/...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coati.algorithm.loss_config import CORRECTIONS
from coati.algorithm.registry import (
    GROUP_FILTERS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    REWARD_SHAPERS,
    SAMPLE_MASKS,
    adv_estimator_names,
)
from coati.config.algo import ALGO_PRESETS, GroupConfig, estimator_family, presets_of
from coati.config.errors import require
from coati.utils.dataclass_cli import options

if TYPE_CHECKING:
    from coati.config.tree import RLConfig


def _family(opt) -> str | None:
    """Which kind of algorithm uses an option: its own ``family`` metadata, else its dataclass's."""
    meta = opt.field.metadata
    return meta["family"] if "family" in meta else getattr(opt.owner, "family", None)


def _value(config, opt):
    node = config
    for name in opt.path:
        node = getattr(node, name)
    return getattr(node, opt.field.name)


def check_families(config: RLConfig, given: frozenset[str] | set[str] = frozenset()) -> None:
    """An option of one kind of algorithm set under the other kind: one line naming the -a that uses it
    (``-a GRPO --kl-reward-coef 0.1`` -> use -a PPO, or the loss's --kl-loss-coef). Set means away from its
    default, or named at all in ``given`` (the option dests the user gave: flags, a YAML file's keys)."""
    a = config.algo
    family = estimator_family(a.groups.advantage)
    preset = ALGO_PRESETS[a.name].get("advantage", GroupConfig.advantage) if a.name in ALGO_PRESETS else None
    subject = f"-a {a.name}" + ("" if preset and estimator_family(preset) == family
                                else f" with advantage {a.groups.advantage!r}")
    for opt in options(type(config)):
        owner_family = _family(opt)
        value = _value(config, opt)
        if owner_family in (None, family) or (value == opt.field.default and opt.dest not in given):
            continue
        names = presets_of(owner_family)
        shorts = [alias for alias in opt.field.metadata["aliases"] if not alias.startswith("--")]
        flags = "/".join((*shorts[:1], opt.long))
        instead = opt.field.metadata.get("instead")
        require(False, f"{subject} does not use {flags} {value} (an option of -a {'/'.join(names)}): drop it or "
                       f"pass -a {names[0]}" + (f"; under {subject} use {instead}" if instead else ""))


def validate_algo(config: RLConfig) -> None:
    """-a, --grpo-config and the algorithm's flags (PPO's: _validate_ppo)."""
    a, loss, g = config.algo, config.algo.loss, config.algo.groups
    key = "--grpo-config"
    require(loss.kl_loss_coef >= 0, "-kl/--kl-loss-coef (--grpo-config kl_loss_coef) must be >= 0")
    require(loss.loss_variation in LOSS_AGGREGATIONS,
            f"{key} loss_variation must be one of {', '.join(LOSS_AGGREGATIONS)}, got {loss.loss_variation!r}")
    require(loss.kl_estimator in KL_ESTIMATORS,
            f"{key} kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {loss.kl_estimator!r}")
    require(loss.objective in POLICY_LOSSES,
            f"{key} objective must be one of {', '.join(POLICY_LOSSES)}, got {loss.objective!r}")
    require(g.advantage in adv_estimator_names(),
            f"{key} advantage must be one of {', '.join(adv_estimator_names())}, got {g.advantage!r}")
    check_families(config)
    if a.uses_critic:
        _validate_ppo(config)
    for name, eps in (("clip_eps_low", loss.clip_eps_low), ("clip_eps_high", loss.clip_eps_high)):
        require(eps >= 0, f"{key} {name} must be >= 0, got {eps}")
    require(loss.clip_eps_low <= 1, f"{key} clip_eps_low must be <= 1 (the ratio is clipped below at 1 - eps; 1: "
                                     f"no lower bound), got {loss.clip_eps_low}")
    require(loss.skip_threshold is None or loss.skip_threshold > 1,
            f"{key} skip_threshold must be > 1 (or null to turn it off), got {loss.skip_threshold}")
    _validate_groups(config)
    _validate_optim(config)
    require(a.ppo_epochs >= 1, f"--ppo-epochs must be at least 1, got {a.ppo_epochs}")
    require(a.learner_chunk_size >= 0, f"--learner-chunk-size must be >= 0 (0: off), got {a.learner_chunk_size}")
    require(loss.correction in CORRECTIONS,
            f"--off-policy-correction must be one of {', '.join(CORRECTIONS)}, got {loss.correction!r}")
    require(loss.tis_cap >= 1, f"--tis-cap must be >= 1 (a cap below 1 would shrink on-policy tokens), got {loss.tis_cap}")
    staleness = config.parallel.max_staleness
    require(staleness >= 0, f"-nb/--max-staleness must be >= 0 (0: sync mode), got {staleness}")
    require(staleness == 0 or a.learner_chunk_size == 0,
            "--learner-chunk-size needs -nb/--max-staleness 0: the learner generates each round with the weights it "
            "has just published, which is the sync protocol; drop one of the two")


def _validate_groups(config: RLConfig) -> None:
    g, key = config.algo.groups, "--grpo-config"
    if g.filter_range is not None:
        require(len(g.filter_range) == 2, f"{key} filter_range must be [low, high] (two numbers), "
                                          f"got {list(g.filter_range)}")
        low, high = g.filter_range
        require(0 <= low <= high <= 1,
                 f"{key} filter_range must satisfy 0 <= low <= high <= 1, got [{low}, {high}]")
    for key_name, names, table in (("reward_shapers", g.reward_shapers, REWARD_SHAPERS),
                                   ("sample_masks", g.sample_masks, SAMPLE_MASKS),
                                   ("group_filters", g.group_filters, GROUP_FILTERS)):
        for name in names:
            require(name in table, f"{key} {key_name}: {name!r} is not registered; choose among {', '.join(table)}, "
                                   "or register your own (--plugins FILE.py, docs/algorithms.md)")
    require(g.max_draw_multiple >= 1, f"{key} max_draw_multiple must be at least 1, got {g.max_draw_multiple}")
    if g.soft_over_length_punishment:
        mnt = config.sampling.max_new_tokens
        require(1 <= g.cache_length <= mnt,
                 f"{key} cache_length must lie in [1, -mnt={mnt}] with soft_over_length_punishment, got {g.cache_length}")
    G = config.batch.num_generations
    require(g.topk_samples is None or 1 <= g.topk_samples <= G,
            f"--topk-samples must lie in [1, -g={G}] (samples kept per group), got {g.topk_samples}")


def _validate_optim(config: RLConfig) -> None:
    """--lr-scheduler, the warm-up, --weight-decay, --max-steps, --gradient-checkpointing against the plugin."""
    config.algo.optim.check(config.parallel.plugin_spec)


def _validate_ppo(config: RLConfig) -> None:
    """A critic's estimator (-a PPO): a score source, and what the critic and the KL-in-reward exclude."""
    a, ppo, p = config.algo, config.algo.ppo, config.parallel
    name = f"advantage {a.groups.advantage!r} (-a {a.name})"
    require(ppo.uses_reward_model or ppo.verifiable_reward_weight > 0,
            f"{name} needs a score: pass --reward-model DIR (a `coati rm` output) and/or --verifiable-reward-weight > 0")
    require(p.tensor_parallel_size == 1 and p.pipeline_parallel_size == 1,
            f"{name} trains a critic beside the policy: the -tp/-pp shard policies know only the LM head, not the "
            "critic's value head; use data parallelism and ZeRO/FSDP2 (-t, -zero)")
    require(a.groups.filter_range is None and not a.groups.dynamic_batching,
            f"{name} trains on every group: drop filter_range / dynamic_batching from --grpo-config")
    require(ppo.gamma >= 0 and 0 <= ppo.lam <= 1, f"--gamma must be >= 0 and --lam in [0, 1], got {ppo.gamma}, {ppo.lam}")
    require(ppo.value_clip > 0, f"--value-clip must be > 0, got {ppo.value_clip}")
    require(ppo.kl_reward_coef >= 0, f"--kl-reward-coef must be >= 0, got {ppo.kl_reward_coef}")
    require(ppo.kl_target is None or ppo.kl_target > 0, f"--kl-target must be > 0 (or unset), got {ppo.kl_target}")
    require(ppo.kl_horizon >= 1, f"--kl-horizon must be at least 1, got {ppo.kl_horizon}")
    require(ppo.score_clip is None or ppo.score_clip > 0, f"--score-clip must be > 0, got {ppo.score_clip}")
    require(ppo.critic_learning_rate is None or ppo.critic_learning_rate > 0,
            f"--critic-learning-rate must be > 0, got {ppo.critic_learning_rate}")
