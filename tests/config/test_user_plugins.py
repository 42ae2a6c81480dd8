"""A user's plugins are imported before anything asks a registry (coati/config/user_plugins.py), whichever door a
run comes in by: a ``--config`` YAML's ``plugins:`` (with the names it registers given in the same file or on the
line), the line's ``--plugins``, a mapping for ``coati.build_config`` / ``coati.run``, coati evaluate; every registry
a plugin fills is seen by the checks. A bad entry is one line naming where it was written."""

import json
import os

import pytest

import coati
from coati.config.cli import config_from_args
from coati.config.errors import ConfigError
from coati.config.user_plugins import plugins_of_line, plugins_of_mapping
from coati.launcher.preflight import check_inputs
from coati.train import command_parser

# One of each kind a plugin may register, named after the test's tmp directory (each test registers afresh;
# registries_restored takes them out again).
PARTS = '''
from coati.algorithm.registry import (get_policy_loss, register_adv_est, register_group_filter, register_policy_loss,
                                      register_reward_shaper, register_sample_mask)
from coati.rollout.env import Environment, StepResult, register_env
from rewards.builtin import RewardType, register_reward_type
from rewards.types import RewardResult


@register_policy_loss("{tag}_loss")
def loss(inputs, config):
    return get_policy_loss("ppo_clip")(inputs, config)


@register_adv_est("{tag}_adv")
def advantage(rewards):
    return rewards - rewards.mean(dim=1, keepdim=True)


@register_reward_shaper("{tag}_shaper")
def shaper(rewards, groups):
    return rewards


@register_sample_mask("{tag}_mask")
def mask(groups):
    return None


@register_group_filter("{tag}_filter")
def keep(groups):
    return groups


@register_env("{tag}_env")
class Once(Environment):
    def reset(self, row):
        self.row = row

    def step(self, model_text):
        return StepResult(reward=float(model_text.strip() == self.row.label), done=True)


class Same:
    def score_groups(self, groups, labels):
        return [[RewardResult(float(r == label), r == label, True, r, "ok") for r in responses]
                for responses, label in zip(groups, labels)]


register_reward_type(RewardType("{tag}_kind", Same, lambda value, key: str(value), "any text", "", "{{answer}}"))
'''


@pytest.fixture
def parts(tmp_path, monkeypatch, registries_restored):
    """(the plugin file's name, relative to the working directory, its tag) in a fresh working directory."""
    tag = "p" + tmp_path.name.replace("-", "_")
    (tmp_path / "my_parts.py").write_text(PARTS.format(tag=tag))
    monkeypatch.chdir(tmp_path)
    return "my_parts.py", tag


def rows(tmp_path) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"messages": f"Say {w}.", "label": w}) + "\n" for w in ("yes", "no") * 4))
    return str(path)


def every_name(tag: str) -> dict:
    """Options that name one row of each registry the plugin file fills."""
    return {"reward_type": f"{tag}_kind", "reward_weights": f"{tag}_kind:2", "env": f"{tag}_env",
            "grpo_config": {"objective": f"{tag}_loss", "advantage": f"{tag}_adv", "reward_shapers": [f"{tag}_shaper"],
                            "sample_masks": [f"{tag}_mask"], "group_filters": [f"{tag}_filter"]}}


SMALL = {"inference_batch_size": 4, "inference_microbatch_size": 4, "train_batch_size": 4,
         "train_minibatch_size": 4, "train_microbatch_size": 8}


def assert_every_name(config, tag: str, plugin: str) -> None:
    assert config.data.reward_type == f"{tag}_kind" and config.data.reward_weights == f"{tag}_kind:2"
    loss, groups = config.algo.loss, config.algo.groups
    assert (loss.objective, groups.advantage, config.episodes.env) == (f"{tag}_loss", f"{tag}_adv", f"{tag}_env")
    assert (groups.reward_shapers[-1], groups.sample_masks[-1], groups.group_filters[-1]) == \
        (f"{tag}_shaper", f"{tag}_mask", f"{tag}_filter")
    # the file, absolute, in the config every actor receives: each of them imports it before it builds
    assert config.parts.plugins == (os.path.abspath(plugin),)
    check_inputs(config, engine=False)  # the start-up checks: the kind reads the rows' labels, the env is made


def train_config(argv):
    parser = command_parser(argv, "coati train", "", {})
    return config_from_args(parser.parse_args(argv), None, given=parser.given)


def test_a_config_files_plugins_come_before_its_own_keys(parts, tmp_path, tiny_model_dir):
    """The reported defect: plugins: and -rt (and every other registered name) in one YAML were refused, as the
    file's keys were checked before its plugins were imported."""
    plugin, tag = parts
    import yaml

    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"plugins": [plugin], **every_name(tag), **SMALL,
                                                       "model": tiny_model_dir, "dataset": rows(tmp_path)}))
    assert_every_name(train_config(["--config", "run.yaml"]), tag, plugin)


def test_a_config_files_plugins_come_before_the_lines_flags(parts, tmp_path, tiny_model_dir):
    plugin, tag = parts
    (tmp_path / "parts.yaml").write_text(f"plugins: {plugin}\n")
    names = every_name(tag)
    argv = ["--config", "parts.yaml", "-m", tiny_model_dir, "-d", rows(tmp_path), "-rt", names["reward_type"],
            "--reward-weights", names["reward_weights"], "--env", names["env"],
            "--grpo-config", json.dumps(names["grpo_config"])]
    argv += [arg for key, value in SMALL.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
    assert_every_name(train_config(argv), tag, plugin)
    # the same names with the line's --plugins and no file
    argv[:2] = ["--plugins", plugin]
    assert_every_name(train_config(argv), tag, plugin)


def test_the_python_api_imports_a_mappings_plugins_first(parts, tmp_path, tiny_model_dir):
    plugin, tag = parts
    config = coati.build_config({"plugins": [plugin], **every_name(tag)}, model=tiny_model_dir,
                                dataset=rows(tmp_path), backend="transformers", **SMALL)
    assert_every_name(config, tag, plugin)


def test_evaluate_takes_a_config_files_plugins_first(parts, tmp_path, tiny_model_dir):
    from coati.rlhf.evaluate import parse_options

    plugin, tag = parts
    (tmp_path / "eval.yaml").write_text(f"plugins: [{plugin}]\nreward_type: {tag}_kind\n")
    config, line = parse_options(["--config", "eval.yaml", "-m", tiny_model_dir, "-d", rows(tmp_path)],
                                 "coati evaluate")
    assert config.reward_type == f"{tag}_kind" and line == f"reward: -rt {tag}_kind"


def test_where_a_commands_plugins_are_read_from(tmp_path):
    (tmp_path / "run.yaml").write_text("plugins: [a.py, my_pkg.parts]\nlearning_rate: 1e-4\n")
    config = str(tmp_path / "run.yaml")
    assert plugins_of_line(["--config", config, "-rt", "boxed"]) == (config, ["a.py", "my_pkg.parts"], [])
    # the line's replace the file's, as any flag's value does (the parsed option holds the line's alone)
    assert plugins_of_line(["--config", config, "--plugins", "b.py", "-rt", "boxed", "--plugins=c.py"]) == \
        (config, [], ["b.py", "c.py"])
    assert plugins_of_line(["-rt", "boxed"]) == (None, [], [])
    # a file that is missing or not YAML has none here: the parser says what is wrong with it
    (tmp_path / "bad.yaml").write_text("plugins: [a.py\n")
    assert plugins_of_line(["--config", str(tmp_path / "bad.yaml")])[1] == []
    assert plugins_of_line(["--config", str(tmp_path / "none.yaml")])[1] == []
    assert plugins_of_mapping({"plugins": "a.py"}) == ["a.py"] and plugins_of_mapping({"plugins": ["a", 3]}) == []
    assert plugins_of_mapping(None) == []


def test_a_bad_plugin_in_a_config_file_is_one_line_naming_both(tmp_path, monkeypatch, capsys, registries_restored):
    import rl_example
    from coati.rlhf import cli, evaluate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.py").write_text("x = 1\nraise RuntimeError('the parts are broken')\n")
    (tmp_path / "missing.yaml").write_text("plugins: [nowhere.py]\nreward_type: nowhere_kind\n")
    (tmp_path / "broken.yaml").write_text("plugins: broken.py\n")
    missing = ("error: --config missing.yaml: --plugins nowhere.py: no such file (give a .py file's path, or a module "
               "name such as my_pkg.parts that `python -c 'import my_pkg.parts'` imports)\n")
    broken = (f"error: --config broken.yaml: --plugins broken.py: importing it failed at {tmp_path / 'broken.py'}:2: "
              "RuntimeError: the parts are broken\n")
    for main in (rl_example.main, evaluate.main, cli.sft_main, cli.rm_main):
        assert main(["--config", "missing.yaml"]) == 2
        assert capsys.readouterr().err == missing
        assert main(["--config", "broken.yaml"]) == 2
        assert capsys.readouterr().err == broken
    with pytest.raises(ConfigError) as err:
        coati.build_config({"plugins": ["nowhere.py"], "reward_type": "nowhere_kind"})
    assert str(err.value) == missing.removeprefix("error: --config missing.yaml: ").strip()
