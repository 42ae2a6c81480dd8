"""One vocabulary across the commands: either spelling of a long flag, a "did you mean" for an unknown flag or
key, one default per option in --help, one name per KL, and a short flag means one thing everywhere."""

from __future__ import annotations

import re

import pytest

import rl_example
from coati import cli
from coati.config.algo import ALGOS
from coati.config.cli import RLOptions, build_parser, config_from_args, config_from_dict
from coati.config.errors import ConfigError
from coati.config.stage import RMConfig, SFTConfig
from coati.rlhf.eval_config import EvalConfig
from coati.utils import dataclass_cli
from coati.utils.dataclass_cli import ConfigFileError, parse

COMMANDS = {"train": RLOptions, "sft": SFTConfig, "rm": RMConfig, "evaluate": EvalConfig}


def parser_of(name: str):
    if name == "train":
        return build_parser("coati train")
    return dataclass_cli.build_parser(COMMANDS[name], f"coati {name}", "")


def refused(argv: list[str], capsys) -> str:
    """The one error line argparse exits with."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[-1]


@pytest.mark.parametrize("name, argv, dest, value", [
    ("train", ["--input_key", "question"], "input_key", "question"),
    ("train", ["--max_new_tokens=12"], "max_new_tokens", 12),
    ("train", ["--ray-dir", "/tmp/r"], "ray_dir", "/tmp/r"),  # the other way round: ColossalChat's underscores
    ("train", ["--master-port", "29500"], "master_port", 29500),
    ("train", ["--no_progress"], "progress", False),
    ("sft", ["--learning_rate", "0.1", "--eval_fraction", "0"], "learning_rate", 0.1),
    ("evaluate", ["--max_prompt_tokens", "7"], "max_prompt_tokens", 7),
])
def test_every_long_flag_takes_its_other_spelling(name, argv, dest, value):
    assert getattr(parser_of(name).parse_args(argv), dest) == value


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_lists_one_spelling_and_says_underscores_work(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = parser_of(name).format_help()
    assert "--learning_rate" not in text and "--max_new_tokens" not in text and "--save_dir" not in text
    assert "spelt with underscores (--input_key = --input-key)" in " ".join(text.split())


def test_the_pipeline_command_takes_underscores_too(tmp_path, monkeypatch):
    from coati.rlhf import pipeline

    seen = {}
    monkeypatch.setattr(pipeline, "dummy_plan", lambda save_dir, project: seen.update(sd=save_dir) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        pipeline.main(["--dummy", "--save_dir", str(tmp_path)])
    assert seen["sd"] == str(tmp_path)


@pytest.mark.parametrize("argv, expected", [
    (["train", "--lerning-rate", "1"], "(did you mean --learning-rate"),
    (["train", "--max_new_token", "1"], "(did you mean --max-new-tokens"),
    (["sft", "--batchsize", "1"], "(did you mean --batch-size"),
    (["evaluate", "--modez", "greedy"], "(did you mean --modes"),
])
def test_an_unknown_flag_names_the_closest(argv, expected, capsys):
    line = refused(argv, capsys)
    assert "unrecognized arguments" in line and expected in line, line
    assert line.count("--") <= 4  # the flag itself and one or two suggestions, not a list


def test_an_unknown_yaml_key_names_the_closest_not_every_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lerning_rate: 1e-4\n")
    with pytest.raises(ConfigFileError) as info:
        build_parser().parse_args(["--config", str(path)])
    message = str(info.value)
    assert "unknown key 'lerning_rate' (did you mean 'learning_rate'" in message and "\n" not in message
    assert "valid keys" not in message and len(message) < 200, message
    path.write_text("qqqqzz: 1\n")
    with pytest.raises(ConfigFileError, match="the keys are the long flag names of --help"):
        build_parser().parse_args(["--config", str(path)])
    with pytest.raises(ConfigFileError, match=r"unknown key 'kl_reward_cof' \(did you mean 'kl_reward_coef'"):
        config_from_dict({"kl_reward_cof": 0.1}, demo=rl_example._placeholder_demo())


def help_entries(parser) -> dict[str, str]:
    """Each option's help entry, by its first flag (one line per flag with a wide terminal)."""
    entries: dict[str, str] = {}
    current = None
    for line in parser.format_help().splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = ""
        if current:
            entries[current] += line.strip() + " "
    return entries


@pytest.mark.parametrize("name", list(COMMANDS))
def test_one_default_per_option(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")
    for flag, entry in help_entries(parser_of(name)).items():
        assert entry.count("(default:") <= 1 and "(default: None)" not in entry, (flag, entry)


@pytest.mark.parametrize("argv, owner, instead", [
    (["-a", "GRPO", "--kl-coef", "0.1"], "an option of -a PPO", "use --kl-loss-coef"),
    (["-a", "DAPO", "--kl-reward-coef", "0.05"], "an option of -a PPO", "use --kl-loss-coef"),  # the default value
    (["-a", "PG", "--gamma", "1.0"], "an option of -a PPO", "pass -a PPO"),
    (["-a", "PPO", "--reward-model", "r", "-kl", "0"], "an option of -a GRPO/DAPO/PG/GSPO/CISPO/DrGRPO",
     "use --kl-reward-coef"),
    (["-a", "PPO", "--reward-model", "r", "--topk-samples", "2"], "an option of -a GRPO/DAPO/PG/GSPO/CISPO/DrGRPO",
     "pass -a GRPO"),
])
def test_an_option_of_another_algorithm_is_refused_when_given(argv, owner, instead):
    parser = build_parser()
    args = parser.parse_args(argv)
    with pytest.raises(ConfigError) as info:
        config_from_args(args, rl_example._placeholder_demo(), given=parser.given)
    assert owner in str(info.value) and instead in str(info.value) and "\n" not in str(info.value)


def test_given_counts_config_file_keys_and_mapping_keys(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("kl_reward_coef: 0.05\n")
    parser = build_parser()
    args = parser.parse_args(["--config", str(path)])
    with pytest.raises(ConfigError, match="does not use --kl-reward-coef"):
        config_from_args(args, rl_example._placeholder_demo(), given=parser.given)
    with pytest.raises(ConfigError, match="does not use -kl/--kl-loss-coef"):
        config_from_dict({"reward_model": "r", "kl_loss_coef": 0.0}, defaults={"algo": "PPO"},
                         demo=rl_example._placeholder_demo())
    # the own algorithm's KL, and the defaults left alone, pass
    config = config_from_args(parser.parse_args(["-a", "GRPO", "-kl", "0.1"]), rl_example._placeholder_demo(),
                              given=parser.given)
    assert config.algo.loss.kl_loss_coef == 0.1


def long_flags(cls) -> dict[str, set[str]]:
    """short flag -> the long flags of the same option."""
    return {flag: {f for f in opt.flags if f.startswith("--")}
            for opt in dataclass_cli.options(cls) for flag in opt.flags if not flag.startswith("--")}


def test_a_short_flag_means_one_thing_in_every_command():
    tables = {name: long_flags(cls) for name, cls in COMMANDS.items()}
    shorts = {short for table in tables.values() for short in table}
    for short in shorts:
        spellings = [table[short] for table in tables.values() if short in table]
        assert set.intersection(*spellings), (short, spellings)  # one long name they all take


@pytest.mark.parametrize("argv, replacement", [
    (["sft", "-tbs", "8"], "-bs/--batch-size"),
    (["rm", "-tbs", "8"], "-bs/--batch-size"),
    (["evaluate", "--micro-batch-size", "8"], "-imbs/--inference-microbatch-size"),
    (["evaluate", "--micro_batch_size", "8"], "-imbs/--inference-microbatch-size"),
])
def test_a_flag_another_command_spells_differently_names_the_replacement(argv, replacement, capsys):
    line = refused(argv, capsys)
    assert "is not a flag of coati" in line and replacement in line, line


def test_shared_spellings():
    train = build_parser()
    assert train.parse_args(["--progress-bar"]).progress and not train.parse_args(["--no-progress-bar"]).progress
    assert train.parse_args(["--epochs", "2"]).num_episodes == 2
    assert train.parse_args(["-rm", "r"]).reward_model == "r"
    sft = parse(SFTConfig, ["--no-progress", "-bs", "8", "--num-episodes", "2", "--train-microbatch-size", "4"],
                "coati sft", "")
    assert (sft.progress_bar, sft.batch_size, sft.epochs, sft.micro_batch_size) == (False, 8, 2, 4)
    assert parse(EvalConfig, ["-imbs", "4"], "coati evaluate", "").micro_batch_size == 4
    with pytest.raises(ConfigFileError, match="-bs/--batch-size"):
        dataclass_cli.check_values(SFTConfig, {"tbs": 8}, "section 'sft'")


def test_coati_help_lists_every_algorithm():
    line = next(line for line in cli.usage().splitlines() if re.match(r"\s+train\s", line))
    assert all(name in line for name in ALGOS) and "RLOO" in line
