"""Config that writes itself: --grpo-config keys, their types and help come from the dataclass fields; each KL
has one name (older spellings still work) and belongs to one kind of algorithm; a mapping builds the same config
as the flags; a near-miss key gets a "did you mean"."""

import json
from dataclasses import dataclass

import pytest

import rl_example
from coati.algorithm.loss import PolicyLossConfig
from coati.config.algo import AlgoConfig
from coati.config.cli import build_parser, config_from_args, config_from_dict
from coati.config.errors import ConfigError
from coati.config.grpo_config import build_algo_config, grpo_config_help, grpo_keys, parse_grpo_config
from coati.utils.dataclass_cli import ConfigFileError, option, options, setting


def config_for(*argv, parser=None):
    return config_from_args((parser or build_parser()).parse_args(list(argv)), rl_example._placeholder_demo())


def from_dict(mapping, **kwargs):
    return config_from_dict(mapping, demo=rl_example._placeholder_demo(), **kwargs)


def run_cli(argv, capsys):
    code = rl_example.main(argv)
    return code, capsys.readouterr().err.strip()


# --- a new knob is one field ---

@dataclass(frozen=True)
class EntropyLoss(PolicyLossConfig):
    entropy_coef: float = setting(0.0, "weight of an entropy bonus")
    entropy_floor: float | None = option(None, "a flag too: entropy below this is not rewarded")


@dataclass(frozen=True)
class EntropyAlgo(AlgoConfig):
    loss: EntropyLoss = EntropyLoss()


def test_a_new_field_is_a_grpo_config_key_with_its_type_and_help():
    keys = grpo_keys(EntropyAlgo)
    assert "entropy_coef" in keys and "entropy_coef" not in grpo_keys(AlgoConfig)
    assert (keys["entropy_coef"].kind, keys["entropy_coef"].optional) == (float, False)
    assert (keys["entropy_floor"].kind, keys["entropy_floor"].optional) == (float, True)
    text = grpo_config_help(EntropyAlgo)
    assert "entropy_coef (float, 0.0): weight of an entropy bonus" in text
    assert "entropy_floor (float or null, null): as --entropy-floor" in text
    assert parse_grpo_config('{"entropy_coef": 0.01}', EntropyAlgo) == {"entropy_coef": 0.01}
    with pytest.raises(ConfigError, match=r"^--grpo-config key 'entropy_coef' must be float, got 'high'$"):
        parse_grpo_config('{"entropy_coef": "high"}', EntropyAlgo)
    with pytest.raises(ConfigError, match="unknown key 'entropy_coef'"):
        parse_grpo_config('{"entropy_coef": 0.01}')  # not a key of the real tree
    algo = build_algo_config("DAPO", 1e-6, 1.0, 64, {"entropy_coef": 0.02}, algo_cls=EntropyAlgo, entropy_floor=0.5)
    assert isinstance(algo.loss, EntropyLoss) and algo.loss.entropy_coef == 0.02 and algo.loss.entropy_floor == 0.5
    assert algo.loss.clip_eps_high == 0.28  # the preset still applies to the other keys
    assert "--entropy-floor" in {flag for opt in options(EntropyAlgo) for flag in opt.flags}


def test_every_listed_grpo_config_key_is_taken():
    """The keys the help and the unknown-key error list are the ones parse_grpo_config takes, also where a field's
    flag has another name (``correction`` is --off-policy-correction)."""
    knobs = grpo_keys()
    for key, knob in knobs.items():
        value = knob.field.default
        assert parse_grpo_config(json.dumps({key: value})) == {key: value}, key
    assert parse_grpo_config('{"off_policy_correction": "decoupled"}') == {"correction": "decoupled"}
    assert config_for("--grpo-config", '{"correction": "decoupled"}').algo.loss.correction == "decoupled"


def test_a_preset_row_must_name_fields(monkeypatch):
    from coati.config import algo
    from coati.config.grpo_config import check_presets

    monkeypatch.setitem(algo.ALGO_PRESETS, "X", {"clip_eps_hi": 0.3})
    with pytest.raises(TypeError, match=r"ALGO_PRESETS\['X'\] sets 'clip_eps_hi', which is not a --grpo-config key "
                                        r"\(did you mean 'clip_eps_high'\?\)"):
        check_presets()


def test_every_key_of_the_real_tree_is_a_field():
    keys = grpo_keys()
    assert {"clip_eps_low", "kl_loss_coef", "skip_threshold", "advantage", "filter_range", "topk_samples",
            "ppo_epochs", "learner_chunk_size", "correction", "tis_cap"} <= set(keys)
    assert keys["filter_range"].optional and keys["topk_samples"].kind is int
    assert "name" not in keys and "learning_rate" not in keys  # AlgoConfig's own fields only when marked


# --- the two KLs: one name each, older spellings kept, each refused under the other kind of algorithm ---

@pytest.mark.parametrize("argv", [["-kl", "0.03"], ["--kl-coeff", "0.03"], ["--kl-loss-coef", "0.03"],
                                  ["--grpo-config", '{"beta": 0.03}'], ["--grpo-config", '{"kl_coeff": 0.03}'],
                                  ["--grpo-config", '{"kl_loss_coef": 0.03}']])
def test_the_loss_kl_has_one_name_and_its_aliases(argv):
    assert config_for(*argv).algo.loss.kl_loss_coef == 0.03


@pytest.mark.parametrize("flag", ["--kl-coef", "--kl-reward-coef"])
def test_the_reward_kl_has_one_name_and_its_alias(flag):
    config = config_for("-a", "PPO", "--reward-model", "rm", flag, "0.2")
    assert config.algo.ppo.kl_reward_coef == 0.2 and config.algo.loss.kl_loss_coef == 0.0


def test_yaml_takes_the_old_and_new_names(tmp_path):
    path = tmp_path / "run.yaml"
    for key in ("kl_coeff", "kl-loss-coef", "beta"):
        path.write_text(f"{key}: 0.02\n")
        assert config_for("--config", str(path)).algo.loss.kl_loss_coef == 0.02, key


def test_help_shows_each_kl_once_with_one_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")
    entries = []  # one per option: its flags, then its help on the same or the next line
    for line in build_parser().format_help().split("\n\n", 2)[2].splitlines():
        if line.startswith("  -"):
            entries.append("")
        if entries:
            entries[-1] += line.strip() + " "
    loss = [entry for entry in entries if entry.startswith("-kl ")]
    reward = [entry for entry in entries if entry.startswith("--kl-reward-coef ")]
    assert len(loss) == 1 and loss[0].startswith("-kl COEF, --kl-loss-coef COEF, --kl-coeff COEF ")
    assert loss[0].lower().count("default") == 1, loss
    assert len(reward) == 1 and reward[0].startswith("--kl-reward-coef COEF, --kl-coef COEF ")
    assert reward[0].count("(default: 0.05)") == 1 and reward[0].lower().count("default") == 1, reward


@pytest.mark.parametrize("argv, message", [
    (["-a", "GRPO", "--kl-reward-coef", "0.1"], "-a GRPO does not use --kl-reward-coef 0.1 (an option of -a PPO): "
                                                "drop it or pass -a PPO; under -a GRPO use --kl-loss-coef"),
    (["-a", "DAPO", "--kl-coef", "0.1"], "-a DAPO does not use --kl-reward-coef 0.1 (an option of -a PPO)"),
    (["-a", "PG", "--gamma", "0.9"], "-a PG does not use --gamma 0.9 (an option of -a PPO)"),
    (["-a", "PPO", "--reward-model", "rm", "--kl-coeff", "0.1"],
     "-a PPO does not use -kl/--kl-loss-coef 0.1 (an option of -a GRPO/DAPO/PG/GSPO/CISPO/DrGRPO): drop it or pass "
     "-a GRPO; under -a PPO use --kl-reward-coef"),
    (["-a", "GRPO", "--reward-model", "rm", "--grpo-config", '{"advantage": "gae", "beta": 0.1}'],
     "-a GRPO with advantage 'gae' does not use -kl/--kl-loss-coef 0.1"),
])
def test_an_option_of_another_algorithm_is_one_line(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and err.startswith("error: ") and "\n" not in err and message in err, err


def test_shared_and_default_valued_options_pass():
    assert config_for("-a", "GRPO", "--reward-model", "rm").algo.ppo.reward_model == "rm"  # scores evals too
    assert config_for("-a", "GRPO", "--kl-reward-coef", "0.05").algo.name == "GRPO"  # its default: no effect


# --- a mapping builds what the flags build ---

def test_config_from_dict_equals_the_cli(tmp_path):
    evals = tmp_path / "e.jsonl"
    evals.write_text("{}\n")
    argv = ["-a", "DAPO", "-kl", "0.01", "-g", "4", "-tbs", "16", "-tMbs", "16", "-tmbs", "32", "--no-progress",
            "--grpo-config", json.dumps({"clip_eps_high": 0.3, "filter_range": [0.1, 0.9]}), "-ed",
            json.dumps({"math": str(evals)}), "--max-staleness", "1", "-lr", "1e-5", "--tis-cap", "3"]
    mapping = {"algo": "DAPO", "kl_coeff": 0.01, "num_generations": 4, "train_batch_size": 16,
               "train-minibatch-size": 16, "train_microbatch_size": 32, "progress": False,
               "grpo_config": {"clip_eps_high": 0.3, "filter_range": [0.1, 0.9]}, "eval_dataset": {"math": str(evals)},
               "n_behind": 1, "learning_rate": "1e-5", "tis_cap": 3}
    assert from_dict(mapping) == config_for(*argv)
    assert from_dict({}) == config_for()


def test_config_from_dict_defaults_sit_below_the_mapping_as_a_commands_do():
    ppo = build_parser("coati ppo", algo="PPO")
    mapping = {"reward_model": "rm", "kl_coef": 0.1}
    assert from_dict(mapping, defaults={"algo": "PPO"}) == config_for("--reward-model", "rm", "--kl-coef", "0.1",
                                                                       parser=ppo)
    assert from_dict({"algo": "PG"}, defaults={"algo": "PPO"}).algo.name == "PG"


@pytest.mark.parametrize("mapping, message", [
    ({"lam": "x"}, "run key 'lam' must be float, got 'x'"),
    ({"progress": "no"}, "run key 'progress' must be bool, got 'no'"),
    ({"algo": "PPO2"}, "run key 'algo' must be one of GRPO, DAPO, PG, GSPO, CISPO, DrGRPO, PPO, got 'PPO2'"),
    ({"learnig_rate": 1e-5}, "run has unknown key 'learnig_rate' (did you mean 'learning_rate'?)"),
])
def test_config_from_dict_bad_values_are_one_line(mapping, message):
    with pytest.raises(ConfigFileError) as info:
        from_dict(mapping, source="run")
    assert message in str(info.value) and "\n" not in str(info.value)


# --- did you mean ---

@pytest.mark.parametrize("make, hint", [
    (lambda tmp: ["--grpo-config", '{"clip_eps_hgh": 0.3}'], "(did you mean 'clip_eps_high'?)"),
    (lambda tmp: ["--grpo-config", '{"betta": 0.1}'], "(did you mean 'beta'?)"),
    (lambda tmp: ["--config", _yaml(tmp, "learnig_rate: 1e-5\n")], "(did you mean 'learning_rate'?)"),
    (lambda tmp: ["--config", _yaml(tmp, "lr: 1e-5\n")], "(did you mean 'learning_rate'?)"),  # a short flag's name
    (lambda tmp: ["--config", _yaml(tmp, "kl_reward_coeff: 0.1\n")], "(did you mean 'kl_reward_coef'?)"),
])
def test_a_near_miss_gets_did_you_mean(make, hint, tmp_path, capsys):
    code, err = run_cli(make(tmp_path), capsys)
    assert code == 2 and "unknown key" in err and err.endswith(hint) and "\n" not in err, err


def _yaml(tmp_path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_pipeline_sections_get_did_you_mean(tmp_path, capsys):
    from coati.rlhf import pipeline

    path = _yaml(tmp_path, "stages: [sft]\nsft: {dataset: a.jsonl, epoch: 2}\n")
    assert pipeline.main(["--config", path]) == 2
    assert "section 'sft' has unknown option 'epoch' (did you mean 'epochs'?)" in capsys.readouterr().err
    path = _yaml(tmp_path, "stages: [sft]\nsft: {dataset: a.jsonl, epochs: two}\n")
    assert pipeline.main(["--config", path]) == 2
    assert "section 'sft' key 'epochs' must be int, got 'two'" in capsys.readouterr().err
