"""-a presets, --grpo-config overrides, dedicated flags, and one clear line for every bad value."""

import json

import pytest

import rl_example
from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from coati.config.grpo_config import grpo_keys, parse_grpo_config


def config_for(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), rl_example._placeholder_demo())


def test_grpo_preset():
    algo = config_for("-a", "GRPO").algo
    assert (algo.loss.clip_eps_low, algo.loss.clip_eps_high) == (0.2, 0.2)
    assert algo.loss.loss_variation == "sample_level" and algo.loss.objective == "ppo_clip"
    assert algo.loss.kl_loss_coef == 0.0 and algo.loss.skip_threshold is None
    g = algo.groups
    assert g.filter_range is None and not g.dynamic_batching and not g.soft_over_length_punishment
    assert not g.filter_truncated_response and g.topk_samples is None and g.advantage == "group_norm"
    assert algo.ppo_epochs == 1
    assert config_for("-a", "GRPO", "-kl", "0.04").algo.loss.kl_loss_coef == 0.04  # the loss's KL = -kl


def test_dapo_preset():
    algo = config_for("-a", "DAPO").algo
    assert algo.groups.filter_range == (0.01, 0.99) and algo.groups.dynamic_batching
    assert (algo.loss.clip_eps_low, algo.loss.clip_eps_high) == (0.2, 0.28)
    assert algo.loss.skip_threshold == 20.0 and algo.loss.kl_loss_coef == 0.0
    assert algo.loss.loss_variation == "token_level"
    assert algo.groups.soft_over_length_punishment and algo.groups.filter_truncated_response
    assert algo.groups.cache_length == 2  # min(1024, 8 // 4) with the demo's -mnt 8
    assert config_for("-a", "DAPO", "-mnt", "400").algo.groups.cache_length == 100
    assert config_for("-a", "DAPO", "-mnt", "8192").algo.groups.cache_length == 1024


def test_pg_preset():
    algo = config_for("-a", "PG").algo
    assert algo.loss.objective == "reinforce" and algo.groups.advantage == "group_mean"
    assert algo.groups.filter_range is None and algo.loss.skip_threshold is None


def test_grpo_config_json_overrides_the_preset():
    algo = config_for("-a", "DAPO", "--grpo-config",
                      '{"filter_range": [0.1, 0.9], "clip_eps_high": 0.3, "dynamic_batching": false, '
                      '"skip_threshold": null, "max_draw_multiple": 2}').algo
    assert algo.groups.filter_range == (0.1, 0.9) and algo.loss.clip_eps_high == 0.3
    assert not algo.groups.dynamic_batching and algo.loss.skip_threshold is None
    assert algo.groups.max_draw_multiple == 2
    assert algo.loss.loss_variation == "token_level"  # untouched keys keep the preset
    # every knob on its own: GRPO with DAPO's clip-higher only
    algo = config_for("-a", "GRPO", "--grpo-config", '{"clip_eps_high": 0.28, "loss_variation": "token_level"}').algo
    assert algo.loss.clip_eps_high == 0.28 and algo.loss.loss_variation == "token_level"
    assert algo.groups.filter_range is None


def test_grpo_config_from_json_and_yaml_files(tmp_path):
    path = tmp_path / "algo.json"
    path.write_text(json.dumps({"beta": 0.02, "topk_samples": 3}))
    algo = config_for("-a", "PG", "--grpo-config", str(path)).algo
    assert algo.loss.kl_loss_coef == 0.02 and algo.groups.topk_samples == 3
    path = tmp_path / "algo.yaml"
    path.write_text("filter_range: [0.2, 0.8]\nppo_epochs: 2\nsoft_over_length_punishment: true\ncache_length: 4\n"
                    "beta: 1e-3\n")  # YAML 1.1 reads 1e-3 as a string; it is taken as the number
    algo = config_for("-a", "GRPO", "--grpo-config", str(path)).algo
    assert algo.groups.filter_range == (0.2, 0.8) and algo.ppo_epochs == 2 and algo.groups.cache_length == 4
    assert algo.loss.kl_loss_coef == 0.001


def test_dedicated_flags_win_over_grpo_config():
    algo = config_for("-a", "DAPO", "--grpo-config", '{"ppo_epochs": 3, "topk_samples": 2, "beta": 0.5}',
                      "--ppo-epochs", "2", "--topk-samples", "4", "-kl", "0.01").algo
    assert algo.ppo_epochs == 2 and algo.groups.topk_samples == 4 and algo.loss.kl_loss_coef == 0.01
    assert config_for("-a", "DAPO", "-kl", "0.1").algo.loss.kl_loss_coef == 0.1  # an explicit -kl beats DAPO's beta 0


def test_every_key_is_documented_in_help():
    text = build_parser().format_help().replace("\n", " ").replace("  ", " ")
    for key in grpo_keys():
        assert key in text, key


def run_cli(argv, capsys):
    code = rl_example.main(argv)
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("argv, message", [
    (["--grpo-config", '{"filter_range": [0.9, 0.1]}'], "filter_range must satisfy 0 <= low <= high <= 1"),
    (["--grpo-config", '{"filter_range": [-0.1, 0.5]}'], "filter_range must satisfy 0 <= low <= high <= 1"),
    (["--grpo-config", '{"filter_range": [0.0, 1.5]}'], "filter_range must satisfy 0 <= low <= high <= 1"),
    (["--grpo-config", '{"filter_range": [0.5]}'], "filter_range must be [low, high] (two numbers)"),
    (["--grpo-config", '{"clip_eps_low": -0.1}'], "clip_eps_low must be >= 0"),
    (["--grpo-config", '{"clip_eps_high": -0.2}'], "clip_eps_high must be >= 0"),
    (["--grpo-config", '{"clip_eps_low": 1.5}'], "clip_eps_low must be <= 1"),
    (["-a", "DAPO", "--grpo-config", '{"skip_threshold": 1.0}'], "skip_threshold must be > 1 (or null to turn it off)"),
    (["--grpo-config", '{"skip_threshold": 0.5}'], "skip_threshold must be > 1"),
    (["--topk-samples", "0"], "--topk-samples must lie in [1, -g=8]"),
    (["--topk-samples", "9"], "--topk-samples must lie in [1, -g=8]"),
    (["-g", "4", "-tmbs", "128", "--grpo-config", '{"topk_samples": 5}'], "--topk-samples must lie in [1, -g=4]"),
    (["--ppo-epochs", "0"], "--ppo-epochs must be at least 1"),
    (["--grpo-config", '{"ppo_epochs": -1}'], "--ppo-epochs must be at least 1"),
    (["--grpo-config", "{bad json"], "--grpo-config is not valid JSON"),
    (["--grpo-config", "[0.1, 0.9]"], "--grpo-config must be a JSON object"),
    (["--grpo-config", '{"clip_eps": 0.2}'], "--grpo-config has unknown key 'clip_eps'; valid keys:"),
    (["--grpo-config", '{"dynamic_batching": "yes"}'], "key 'dynamic_batching' must be bool"),
    (["--grpo-config", '{"clip_eps_high": "0.28"}'], "key 'clip_eps_high' must be float"),
    (["--grpo-config", '{"topk_samples": 2.5}'], "key 'topk_samples' must be int or null"),
    (["--grpo-config", '{"loss_variation": "batch_level"}'], "loss_variation must be one of token_level, sample_level"),
    (["--grpo-config", '{"objective": "dpo"}'], "objective must be one of ppo_clip, reinforce"),
    (["--grpo-config", '{"advantage": "no_such_estimator"}'], "advantage must be one of group_norm, group_mean"),
    (["--grpo-config", '{"max_draw_multiple": 0}'], "max_draw_multiple must be at least 1"),
    (["-a", "DAPO", "--grpo-config", '{"cache_length": 0}'], "cache_length must lie in [1, -mnt=8]"),
    (["-a", "DAPO", "--grpo-config", '{"cache_length": 9}'], "cache_length must lie in [1, -mnt=8]"),
    (["-kl", "-0.1"], "-kl/--kl-loss-coef (--grpo-config kl_loss_coef) must be >= 0"),
    (["--grpo-config", '{"beta": -1}'], "-kl/--kl-loss-coef (--grpo-config kl_loss_coef) must be >= 0"),
    (["--grpo-config", "missing.yaml"], "--grpo-config file not found: missing.yaml"),
    # given together (a chunk alone: -ibs and -tbs follow it, tests/config/test_batch_defaults.py)
    (["-ibs", "64", "-tbs", "32", "--learner-chunk-size", "16"], "num_inferencer*ibs + --learner-chunk-size (64 + 16 "
                                                                 "= 80) must be a multiple of data-parallel "
                                                                 "trainers*tbs (32)"),
    (["-t", "2", "-ibs", "64", "-tbs", "32", "--learner-chunk-size", "32"],
     "(64 + 32 = 96) must be a multiple of data-parallel trainers*tbs (64)"),
    (["--learner-chunk-size", "-1"], "--learner-chunk-size must be >= 0"),
])
def test_bad_algorithm_settings_give_one_line(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert err.count("\n") == 0 and err.startswith("error: "), err
    assert message in err, err


def test_malformed_config_files(tmp_path, capsys):
    bad_json = tmp_path / "a.json"
    bad_json.write_text("{oops")
    code, err = run_cli(["--grpo-config", str(bad_json)], capsys)
    assert code == 2 and f"--grpo-config file {bad_json} is not valid JSON" in err and err.count("\n") == 0
    bad_yaml = tmp_path / "a.yaml"
    bad_yaml.write_text("filter_range: [0.1\n  beta: : :\n")
    code, err = run_cli(["--grpo-config", str(bad_yaml)], capsys)
    assert code == 2 and "is not valid YAML" in err and err.count("\n") == 0
    unknown = tmp_path / "b.yaml"
    unknown.write_text("clip_high: 0.3\n")
    code, err = run_cli(["--grpo-config", str(unknown)], capsys)
    assert code == 2 and "has unknown key 'clip_high'" in err


def test_parse_grpo_config_empty_and_types():
    assert parse_grpo_config(None) == {} and parse_grpo_config("") == {}
    # an older name (beta) is taken as its key
    assert parse_grpo_config('{"beta": 0, "skip_threshold": 5}') == {"kl_loss_coef": 0, "skip_threshold": 5}
    with pytest.raises(ConfigError, match="must be bool"):
        parse_grpo_config('{"filter_truncated_response": 1}')  # 1 is not a bool
    with pytest.raises(ConfigError, match=r"^--grpo-config key 'skip_idle_samples' must be bool, got 'yes'$"):
        parse_grpo_config('{"skip_idle_samples": "yes"}')


def test_every_registered_name_is_reachable_from_the_cli(capsys):
    from coati.algorithm.advantage import adv_estimator_names
    from coati.algorithm.loss import POLICY_LOSSES
    from coati.config.algo import ALGO_PRESETS

    help_text = build_parser().format_help().replace("\n", " ")
    for name in ALGO_PRESETS:
        assert name in help_text
        if ALGO_PRESETS[name].get("advantage") in adv_estimator_names("token_values"):
            code, err = run_cli(["-a", name], capsys)  # a critic's estimator needs a score source
            assert code == 2 and "needs a score: pass --reward-model" in err, err
            continue
        assert config_for("-a", name).algo.name == name
    for name in POLICY_LOSSES:
        assert config_for("--grpo-config", json.dumps({"objective": name})).algo.loss.objective == name
        assert name in help_text
    for name in adv_estimator_names("group") + adv_estimator_names("batch"):
        assert config_for("--grpo-config", json.dumps({"advantage": name})).algo.groups.advantage == name
        assert name in help_text
    for name in adv_estimator_names("token_values"):  # a critic's estimator: PPO, which needs a score source
        code, err = run_cli(["--grpo-config", json.dumps({"advantage": name})], capsys)
        assert code == 2 and "needs a score: pass --reward-model" in err, err


def test_a_newly_registered_estimator_is_usable_by_name_alone():
    """Opening the dispatch: one decorated function, no other edit, and the CLI and the trainer's shaping use it."""
    import torch

    from coati.algorithm.advantage import ADV_ESTIMATORS, register_adv_est
    from coati.rollout.group import RolloutGroup
    from coati.trainer.group_algorithm import shaped_group_tensors

    @register_adv_est("leave_one_out")
    def leave_one_out(rewards):  # RLOO: r_i - mean of the others
        n = rewards.shape[1]
        return rewards * n / (n - 1) - rewards.mean(dim=1, keepdim=True) * n / (n - 1)

    try:
        algo = config_for("--grpo-config", '{"advantage": "leave_one_out"}').algo
        group = RolloutGroup(prompt_ids=[1], responses=[[5]] * 4, logprobs=[[0.0]] * 4, rewards=[1.0, 0.0, 0.0, 1.0],
                             correct=[True, False, False, True], format_ok=[True] * 4,
                             finish_reasons=["stop"] * 4, policy_version=0)
        _, adv, _ = shaped_group_tensors([group], algo.groups, 8)
        # r - mean of the other three: 1 - 1/3, 0 - 2/3
        assert torch.allclose(adv, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    finally:
        del ADV_ESTIMATORS["leave_one_out"]


def test_a_users_own_group_stages_are_turned_on_by_name():
    """A shaper, a mask and a filter registered from outside coati, named in --grpo-config: each runs in its
    place (hand-computed values); an unregistered name is one line."""
    import torch

    from coati.algorithm.registry import GROUP_FILTERS, REWARD_SHAPERS, SAMPLE_MASKS
    from coati.algorithm.pipeline import register_group_filter, register_reward_shaper, register_sample_mask
    from coati.rollout.group import RolloutGroup
    from coati.trainer.group_algorithm import filter_groups, shaped_group_tensors

    @register_reward_shaper("doubled")
    def doubled(rewards, data, settings, max_new_tokens):
        return 2 * rewards

    @register_sample_mask("first_two")
    def first_two(rewards, data, settings):
        return torch.arange(rewards.shape[1]).expand_as(rewards) < 2

    @register_group_filter("some_reward")
    def some_reward(data, settings):
        return data.rewards.sum(dim=1) > 0

    def group(rewards):
        return RolloutGroup(prompt_ids=[1], responses=[[5]] * 4, logprobs=[[0.0]] * 4, rewards=rewards,
                            correct=[r > 0 for r in rewards], format_ok=[True] * 4, finish_reasons=["stop"] * 4,
                            policy_version=0)

    try:
        groups = config_for("--grpo-config", '{"reward_shapers": ["doubled"], "sample_masks": ["first_two"], '
                                             '"group_filters": ["some_reward"], "advantage": "group_mean"}').algo.groups
        rewards, adv, mask = shaped_group_tensors([group([1.0, 0.0, 0.0, 1.0])], groups, 8)
        assert rewards.tolist() == [[2.0, 0.0, 0.0, 2.0]] and adv.tolist() == [[1.0, -1.0, -1.0, 1.0]]
        assert mask.tolist() == [[1.0, 1.0, 0.0, 0.0]]
        kept, stats = filter_groups([group([0.0] * 4), group([1.0, 0.0, 0.0, 0.0])], groups)
        assert [g.rewards for g in kept] == [[1.0, 0.0, 0.0, 0.0]] and stats == {"groups_filtered": 1}
        with pytest.raises(ConfigError, match=r"^--grpo-config sample_masks: 'nope' is not registered; choose among "
                                              r"topk, truncated, first_two, or register your own"):
            config_for("--grpo-config", '{"sample_masks": ["nope"]}')
    finally:
        del REWARD_SHAPERS["doubled"], SAMPLE_MASKS["first_two"], GROUP_FILTERS["some_reward"]


# --- -a PPO: a critic's estimator ---

def test_ppo_preset_and_its_options_reach_the_config():
    algo = config_for("-a", "PPO", "--reward-model", "rm", "-g", "1", "-tmbs", "32", "--lam", "0.9", "--kl-coef", "0.2",
                      "--kl-target", "6", "--critic-learning-rate", "1e-5").algo
    assert algo.uses_critic and algo.groups.advantage == "gae" and algo.loss.loss_variation == "token_level"
    assert algo.loss.kl_loss_coef == 0.0  # the KL is in the reward
    assert (algo.ppo.reward_model, algo.ppo.lam, algo.ppo.kl_reward_coef, algo.ppo.kl_target) == ("rm", 0.9, 0.2, 6.0)
    assert algo.ppo.critic_learning_rate == 1e-5 and algo.ppo.value_loss == "clipped"
    assert not config_for("-a", "GRPO").algo.uses_critic


@pytest.mark.parametrize("argv, message", [
    (["-a", "PPO"], "needs a score: pass --reward-model"),
    (["-a", "PPO", "-g", "1", "-tmbs", "32"], "needs a score"),
    (["-a", "GRPO", "-g", "1", "-tmbs", "32"], "-g/--num-generations must be at least 2"),
    (["-a", "PPO", "--reward-model", "rm", "-t", "2", "-tp", "2"], "critic's value head; use data parallelism"),
    (["-a", "PPO", "--reward-model", "rm", "-kl", "0.1"], "-a PPO does not use -kl/--kl-loss-coef 0.1 (an option of "
                                                          "-a GRPO/DAPO/PG/GSPO/CISPO/DrGRPO)"),
    (["-a", "PPO", "--reward-model", "rm", "--grpo-config", '{"filter_range": [0.1, 0.9]}'],
     "trains on every group: drop filter_range"),
    (["-a", "PPO", "--reward-model", "rm", "--lam", "1.5"], "--lam in [0, 1]"),
    (["-a", "PPO", "--reward-model", "rm", "--kl-target", "0"], "--kl-target must be > 0"),
    (["-a", "PPO", "--reward-model", "rm", "--value-clip", "0"], "--value-clip must be > 0"),
])
def test_bad_ppo_flags_give_one_line(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_ppo_model_directories_are_checked_before_any_actor(tiny_model_dir, tmp_path, capsys):
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"messages": f"{i}+1=", "gt_answer": str(i + 1)}) + "\n" for i in range(64)))
    base = ["-m", tiny_model_dir, "-d", str(rows), "-a", "PPO", "-ibs", "32", "-imbs", "32", "-tbs", "32"]
    code, err = run_cli([*base, "--reward-model", str(tmp_path / "nope")], capsys)
    assert code == 2 and "--reward-model: reward model directory not found" in err, err
    code, err = run_cli([*base, "--reward-model", tiny_model_dir], capsys)  # a causal LM, no score head
    assert code == 2 and "has no score head" in err, err
    code, err = run_cli([*base, "--verifiable-reward-weight", "1", "--critic-model", str(tmp_path)], capsys)
    assert code == 2 and "--critic-model directory not found" in err, err
