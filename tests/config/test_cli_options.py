"""rl_example.py's flags come from the RLConfig tree's option() metadata: every one is in --help with its aliases
and default, --config FILE.yaml sets them below the flags, and -a PPO's options reach config.algo.ppo."""

import dataclasses
import re

import pytest

import rl_example
from coati import cli
from coati.config.cli import RLOptions, build_parser, config_from_args
from coati.config.ppo import PPOConfig
from coati.utils.dataclass_cli import options

# ColossalChat's names (rl_example.py's short aliases and underscored long flags), which users' scripts hold.
COLOSSALCHAT_FLAGS = (
    "-m", "-d", "-ed", "-a", "-rt", "-g", "-ibs", "-imbs", "-tbs", "-tMbs", "-tmbs", "-t", "-i", "-tp", "-pp", "-zero",
    "-ptp", "-b", "-mnt", "-mpt", "-lr", "-kl", "-temp", "-topk", "-topp", "-s", "-e", "-p", "-si", "-sd", "-esd",
    "-rsd", "-ei", "-nb", "--n-behind", "--max-staleness", "--master_address", "--master_port", "--ray_dir",
    "--grpo-config", "--no-progress", "--code-all-or-nothing", "--num-inferencer", "--weight-sync-timeout",
    "--off-policy-correction", "--model", "--dataset", "--eval-dataset",
)


def config_for(*argv, parser=None):
    return config_from_args((parser or build_parser()).parse_args(list(argv)), rl_example._placeholder_demo())


def test_every_option_of_the_tree_is_in_help_with_its_aliases_and_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")  # one line per flag: help texts compare whole
    parser = build_parser()
    entries = []  # one per flag: its invocation, then its help on the same or the next line
    for line in parser.format_help().split("\n\n", 2)[2].splitlines():
        if line.startswith("  -"):
            entries.append("")
        if entries:
            entries[-1] += line.strip() + " "
    for opt in options(RLOptions):
        line = next(entry for entry in entries if entry.startswith((opt.flags[0] + " ", opt.flags[0] + ",")))
        assert all(f"{flag} " in line or f"{flag}," in line for flag in opt.flags), (opt.where, line)
        text = opt.field.metadata["help"]  # one default: the help's own words, else "(default: X)" added
        says = re.search(r"\bdefault\b", text, re.IGNORECASE) is not None  # ("defaults" is not a default)
        assert (text if says else f"{text} (default: {opt.shown_default})") in line, line
        assert line.lower().count("default") == text.lower().count("default") + (not says)
    every_flag = {flag for action in parser._actions for flag in action.option_strings}
    assert set(COLOSSALCHAT_FLAGS) <= every_flag, set(COLOSSALCHAT_FLAGS) - every_flag


def test_derived_fields_are_not_flags():
    where = {opt.where for opt in options(RLOptions)}
    for derived in ("ModelConfig.is_embedded_demo", "SamplingParams.n", "SamplingParams.stop_strings",
                    "SamplingParams.seed", "RLConfig.eval_sampling"):
        assert derived not in where
    assert "RunConfig.seed" in where


def test_yaml_config_then_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1e-5\ntrain-batch-size: 16\ntrain_minibatch_size: 16\ntemperature: 0.7\n"
                    "progress: false\ncode_workers: 2\nmax_staleness: 1\nalgo: DAPO\nmaster_port: 29500\n"
                    "grpo_config: '{\"clip_eps_high\": 0.3}'\n")
    config = config_for("--config", str(path), "-tbs", "32", "-tMbs", "32", "-a", "PG")
    assert config.algo.learning_rate == 1e-5  # the file beats the demo's default of the flag
    assert (config.batch.train_batch_size, config.batch.train_minibatch_size) == (32, 32)  # flags beat the file
    assert config.sampling.temperature == 0.7 and not config.run.progress_bar and config.data.code.workers == 2
    assert config.parallel.max_staleness == 1 and config.run.master_port == 29500
    assert config.algo.name == "PG" and config.algo.loss.clip_eps_high == 0.3
    plain = config_for()
    assert (plain.algo.learning_rate, plain.batch.train_batch_size, plain.algo.name) == (3e-4, 32, "GRPO")


@pytest.mark.parametrize("text, message", [
    ("lr: 0.1\n", "--config {path} has unknown key 'lr' (did you mean 'learning_rate'?)"),
    ("train_batch_size: 2.5\n", "--config {path} key 'train_batch_size' must be int or null, got 2.5"),
    ("gamma: fast\n", "--config {path} key 'gamma' must be float, got 'fast'"),
    ("algo: PPO2\n", "--config {path} key 'algo' must be one of GRPO, DAPO, PG, GSPO, CISPO, DrGRPO, PPO, got 'PPO2'"),
    ("[1, 2]\n", "--config {path} must be a mapping of option: value"),
])
def test_bad_config_file_is_one_error_line(tmp_path, capsys, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert rl_example.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message.format(path=path) in err, err


def test_ppo_options_reach_the_algo_config(tmp_path):
    reward_model = tmp_path / "rm"
    reward_model.mkdir()
    (reward_model / "config.json").write_text("{}")
    config = config_for("-a", "PPO", "--reward-model", str(reward_model), "--critic-learning-rate", "1e-5",
                        "--gamma", "0.99", "--lam", "0.9", "--value-clip", "0.3", "--value-loss", "mse",
                        "--kl-coef", "0.02", "--kl-target", "6", "--kl-horizon", "500", "--score-clip", "5",
                        "--no-whiten-advantages", "--verifiable-reward-weight", "0.5")
    assert config.algo.ppo == PPOConfig(reward_model=str(reward_model), critic_learning_rate=1e-5, gamma=0.99,
                                        lam=0.9, value_clip=0.3, value_loss="mse", kl_reward_coef=0.02, kl_target=6.0,
                                        kl_horizon=500, score_clip=5.0, whiten_advantages=False,
                                        verifiable_reward_weight=0.5)
    assert config.algo.name == "PPO" and config.algo.uses_critic
    assert config_for().algo.ppo == PPOConfig()  # every field at its default without the flags
    for opt in options(RLOptions):  # every PPOConfig field is a flag, named after it
        assert opt.owner is not PPOConfig or opt.long == "--" + opt.field.name.replace("_", "-")
    assert {f.name for f in dataclasses.fields(PPOConfig)} <= {opt.dest for opt in options(RLOptions)}


def test_coati_ppo_is_train_with_ppo_as_the_default_algorithm(tmp_path, capsys):
    assert cli.main(["ppo"]) == 2  # PPO's own start-up check: a score source is needed
    assert "(-a PPO) needs a score: pass --reward-model" in capsys.readouterr().err
    ppo = build_parser("coati ppo", algo="PPO")
    path = tmp_path / "ppo.yaml"
    path.write_text("verifiable_reward_weight: 1.0\nkl-coef: 0.1\n")
    config = config_for("--config", str(path), parser=ppo)
    assert config.algo.name == "PPO" and config.algo.ppo.kl_reward_coef == 0.1
    assert config.algo.ppo.verifiable_reward_weight == 1.0
    path.write_text("algo: GRPO\n")  # the file beats the command's default, as it beats a field's
    assert config_for("--config", str(path), parser=ppo).algo.name == "GRPO"
    assert config_for("-a", "DAPO", parser=ppo).algo.name == "DAPO"
    with pytest.raises(SystemExit):
        cli.main(["ppo", "--help"])
    assert "usage: coati ppo" in capsys.readouterr().out


def test_optimizer_knobs_are_flags_yaml_keys_and_grpo_config_keys(tmp_path):
    """Each of AlgoConfig's optim fields: a flag, a --config key and a --grpo-config key; preset < --grpo-config <
    flag, and the field's default when none is given."""
    default = config_for().algo.optim
    assert (default.lr_scheduler, default.lr_warmup_steps, default.weight_decay, default.gradient_checkpointing,
            default.max_steps) == ("constant", 0, 0.0, False, 0)
    flags = config_for("--lr-scheduler", "cosine", "--lr-warmup-steps", "3", "--lr-warmup-ratio", "0.1",
                       "--weight-decay", "0.01", "--gradient-checkpointing", "--max-steps", "7").algo.optim
    assert (flags.lr_scheduler, flags.lr_warmup_steps, flags.lr_warmup_ratio, flags.weight_decay,
            flags.gradient_checkpointing, flags.max_steps) == ("cosine", 3, 0.1, 0.01, True, 7)
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("lr-scheduler: linear\nweight_decay: 0.05\nmax_steps: 4\n")
    from_yaml = config_for("--config", str(yaml_file)).algo.optim
    assert (from_yaml.lr_scheduler, from_yaml.weight_decay, from_yaml.max_steps) == ("linear", 0.05, 4)
    grpo = '{"weight_decay": 0.2, "lr_scheduler": "linear", "gradient_checkpointing": true}'
    mixed = config_for("--grpo-config", grpo, "--weight-decay", "0.3").algo.optim
    assert (mixed.weight_decay, mixed.lr_scheduler, mixed.gradient_checkpointing) == (0.3, "linear", True)
