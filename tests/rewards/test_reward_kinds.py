"""A reward kind is one file and one registration (rewards/builtin.py): a kind added here runs through the loaders,
the scorer, an evaluation's numbers, coati train's and coati evaluate's checks, and the start-up checks ask its row
(sandbox, label, verdict), never its name."""

import json
import os
import sys

import pytest

from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from coati.dataset.loader import DatasetError, load_examples
from coati.dataset.rows import Example, RowFormat
from coati.rollout.evaluation import score_outputs
from coati.rollout.inference_backend import Completion
from coati.utils.user_parts import import_user_parts, ship
from rewards import REWARD_TYPES
from rewards.builtin import RewardType, register_reward_type, reward_type
from rewards.scorer import RewardScorer
from rewards.types import RewardResult, combine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KIND_FILE = os.path.join(ROOT, "examples", "rewards", "exact_string_kind.py")


class Graded:
    """A kind without a verdict: 0.1 per word, up to 1; its own ``correct`` is not read (verdict=False)."""

    def __init__(self, **sandbox_options):
        self.sandbox_options = sandbox_options

    def score_groups(self, groups, labels):
        return [[RewardResult(min(len(r.split()), 10) / 10, True, True, r, "ok") for r in responses]
                for responses in groups]


@pytest.fixture(scope="module")
def kinds():
    """exact_string from its file, as --plugins imports it; two kinds registered right here. After the module, the
    registry and the plugin imports as they were (as conftest's registries_restored, for a whole module)."""
    from coati.utils import user_parts

    saved, imported, modules = dict(REWARD_TYPES), dict(user_parts._imported), set(sys.modules)
    import_user_parts([KIND_FILE])
    register_reward_type(RewardType("words", Graded, lambda value, key: value, "any text", "", "{answer}",
                                    verdict=False))
    register_reward_type(RewardType("sandboxed_words", Graded, lambda value, key: value, "any text", "", "{answer}",
                                    needs_sandbox=True))
    yield
    REWARD_TYPES.clear()
    REWARD_TYPES.update(saved)
    user_parts._imported.clear()
    user_parts._imported.update(imported)
    for name in set(sys.modules) - modules:
        if name.startswith("coati_user_parts_"):
            del sys.modules[name]


def rows(tmp_path, n=64, **extra):
    path = tmp_path / "capitals.jsonl"
    cities = ["Paris", "Rome", "Oslo", "Lima"]
    path.write_text("".join(json.dumps({"messages": f"Capital number {i}?", "label": cities[i % 4], **extra}) + "\n"
                            for i in range(n)))
    return str(path)


def test_one_file_and_one_registration_score_real_rows(kinds, tmp_path):
    examples = load_examples(rows(tmp_path, 4), RowFormat(reward_type="exact_string"))
    assert [e.label for e in examples] == ["Paris", "Rome", "Oslo", "Lima"]
    scorer = RewardScorer("exact_string")
    groups = scorer.score_groups([["Answer: Paris", "Answer:  Paris ", "Answer: paris", "Paris"], ["Answer: Rome"]],
                                 examples[:2])
    assert [[r.reward for r in group] for group in groups] == [[1.0, 1.0, combine(True, 0.0), 0.0], [1.0]]
    assert [r.reason for r in groups[0]] == ["ok", "ok", "wrong answer", "no Answer:"]
    # an evaluation's numbers: 2 of 4 right, 3 in the format
    outputs = [[Completion([1], [0.0], "stop", text)] for text in ("Answer: Paris", "Answer: Milan", "Oslo",
                                                                   "Answer: Lima")]
    result = score_outputs(outputs, examples, scorer)
    assert (result.accuracy, result.format_rate) == (0.5, 0.75)
    assert result.mean_reward == pytest.approx((1.0 + 0.1 + 0.0 + 1.0) / 4)
    # weighted with a user's function, by the kind's name
    weighted = RewardScorer("exact_string", reward_fns=[f"{ROOT}/examples/rewards/length_penalty.py:length_penalty"],
                            reward_weights="exact_string:2")
    assert weighted.score(["Answer: Paris"], examples[0])[0].parts["exact_string"] == 1.0


def test_the_row_names_the_label_and_reads_it(kinds, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": "q", "label": "Paris"}) + "\n" + json.dumps({"messages": "q"}) + "\n"
                   + json.dumps({"messages": "q", "label": 3}) + "\n")
    with pytest.raises(DatasetError) as err:
        load_examples(str(bad), RowFormat(reward_type="exact_string"))
    assert str(err.value) == (f'{bad}:2: missing "label" (the expected text, a non-empty string; this row has '
                              f'messages: name the right one with --label-key) (and 1 more bad rows of 3, the next '
                              f'at {bad}:3)')
    assert reward_type("exact_string").label_keys == ("label",)
    # math rows: the older gt_answer, else label; gt_answer wins when both are there
    math = RowFormat()
    assert math.row_label({"label": "3"}) == ("label", "3")
    assert math.row_label({"gt_answer": "4", "label": "3"}) == ("gt_answer", "4")
    assert math.row_label({"q": "x"}) == ("gt_answer", None)
    assert RowFormat(label_key="answer").row_label({"label": "3"}) == ("answer", None)


def test_a_kind_without_a_verdict_leaves_accuracy_to_the_run(kinds):
    example = Example(messages=(), label="x")
    [short, long] = RewardScorer("words").score(["two words", "w " * 12], example)
    assert (short.reward, short.correct, long.reward, long.correct) == (0.2, None, 1.0, None)
    [short, long] = RewardScorer("words", correct_threshold=0.5).score(["two words", "w " * 12], example)
    assert (short.correct, long.correct) == (False, True)
    assert RewardScorer("boxed").score(["\\boxed{x}"], example)[0].correct is True  # a kind with one: its own


def test_train_and_evaluate_checks_ask_the_row(kinds, tiny_model_dir, tmp_path, monkeypatch):
    """-rt a registered kind: its stops and prompt are the run's; the sandbox is checked (and --code-* refused)
    only for a kind that needs it."""
    from coati.launcher.preflight import check_inputs
    from coati.rlhf.eval_config import check_inputs as check_eval_inputs
    from coati.rlhf.evaluate import parse_options
    import rewards.code

    data = rows(tmp_path)
    config = config_from_args(build_parser().parse_args(["-m", tiny_model_dir, "-d", data, "-rt", "exact_string",
                                                         "--stop", "."]), None)
    assert config.sampling.stop_strings == ("\n", ".")
    assert config.data.system_prompt == "Reply with one line: Answer: followed by the answer."

    def no_sandbox(*args):  # a machine without bubblewrap (the fault only)
        raise rewards.code.SandboxUnavailable("no sandbox on this machine")

    monkeypatch.setattr(rewards.code, "check_sandbox_available", no_sandbox)
    check_inputs(config)  # exact_string needs no sandbox
    sandboxed = ["-m", tiny_model_dir, "-d", data, "-rt", "sandboxed_words"]
    with pytest.raises(ConfigError, match="no sandbox on this machine"):
        check_inputs(config_from_args(build_parser().parse_args(sandboxed), None))
    with pytest.raises(ConfigError, match="--code-workers must be at least 1"):
        config_from_args(build_parser().parse_args([*sandboxed, "--code-workers", "0"]), None)
    config_from_args(build_parser().parse_args(["-m", tiny_model_dir, "-d", data, "-rt", "exact_string",
                                                "--code-workers", "0"]), None)
    # coati evaluate: the same kind, its rows and its stops through the same helper
    evaluation, line = parse_options(["-m", tiny_model_dir, "-d", data, "-rt", "exact_string", "--stop", "."],
                                     "coati evaluate")
    assert line.startswith("reward: -rt exact_string")
    assert evaluation.stop_strings(evaluation.reward_type) == ("\n", ".")
    assert [e.label for e in check_eval_inputs(evaluation, log=lambda m: None).examples[:2]] == ["Paris", "Rome"]


def test_a_kind_registered_in_the_drivers_code_travels(kinds):
    assert "reward type words" in ship().names  # registered outside --plugins: pickled for the actors
    assert not any("exact_string" in name for name in ship().names)  # a --plugins file: each process imports it
    with pytest.raises(ValueError, match="reward type 'words' is already registered"):
        register_reward_type(RewardType("words", Graded, lambda value, key: value, "any text", "", "{answer}"))


def test_the_command_lines_import_a_kind_before_reading_rt(tmp_path, tiny_model_dir, registries_restored):
    """--plugins is imported before the flags are read: its kind is an -rt choice of coati train and evaluate (and of
    a config mapping)."""
    from coati.rlhf.evaluate import parse_options
    from coati.train import command_parser

    kind = tmp_path / "echo_kind.py"
    kind.write_text("from rewards.builtin import RewardType, register_reward_type\n"
                    "register_reward_type(RewardType('echo_label', object, lambda value, key: value, 'any text', '',"
                    " '{answer}'))\n")
    argv = ["-m", tiny_model_dir, "-d", rows(tmp_path), "--plugins", str(kind), "-rt", "echo_label"]
    assert command_parser(argv, "coati train", "", {}).parse_args(argv).reward_type == "echo_label"
    assert parse_options(argv, "coati evaluate")[0].reward_type == "echo_label"
    # a mapping (a pipeline file's section, coati.build_config): its plugins key, before its reward_type is checked
    from coati.config.cli import config_from_dict

    second = tmp_path / "second_kind.py"
    second.write_text(kind.read_text().replace("echo_label", "second_label"))
    config = config_from_dict({"model": tiny_model_dir, "dataset": rows(tmp_path), "plugins": [str(second)],
                               "reward_type": "second_label"})
    assert config.data.reward_type == "second_label"


def test_evaluate_on_a_runs_checkpoint_takes_its_kind_and_plugins(tmp_path, tiny_model_dir, registries_restored):
    import shutil

    from coati.rlhf.eval_config import check_inputs as check_eval_inputs
    from coati.rlhf.evaluate import parse_options

    kind = tmp_path / "run_kind.py"
    kind.write_text("from rewards.builtin import RewardType, register_reward_type\n"
                    "register_reward_type(RewardType('run_kind', object, lambda value, key: value.upper(), 'any text',"
                    " '', '{answer}'))\n")
    checkpoint = shutil.copytree(tiny_model_dir, tmp_path / "step_4")
    (checkpoint / "run_state.json").write_text(json.dumps({"options": {"reward_type": "run_kind",
                                                                       "plugins": [str(kind)]}}))
    config, line = parse_options(["-m", str(checkpoint), "-d", rows(tmp_path)], "coati evaluate")
    assert config.reward_type == "run_kind" and line.startswith("reward: -rt run_kind (the run's own")
    assert check_eval_inputs(config, log=lambda m: None).examples[0].label == "PARIS"
    (checkpoint / "run_state.json").write_text(json.dumps({"options": {"reward_type": "gone_kind"}}))
    config, _ = parse_options(["-m", str(checkpoint), "-d", rows(tmp_path)], "coati evaluate")
    with pytest.raises(ConfigError, match="-rt 'gone_kind' is no registered reward kind .*: pass the --plugins file"):
        check_eval_inputs(config, log=lambda m: None)


def test_every_scoring_command_takes_the_reward_options_from_one_place():
    """coati train/ppo and the RLHF pipeline's ppo section (RLOptions) and coati evaluate (EvalConfig): RewardOptions'
    flags, and the same -rt choices (the registry itself)."""
    from coati.config.cli import RLOptions
    from coati.config.data import RewardOptions
    from coati.rlhf.eval_config import EvalConfig
    from coati.utils.dataclass_cli import options

    def flags(cls):
        return {opt.long: opt for opt in options(cls)}

    shared = flags(RewardOptions)
    assert {"--reward-fn", "--reward-weights", "--reward-url", "--correct-threshold"} <= set(shared)
    for command in (RLOptions, EvalConfig):
        assert {flag: opt.field for flag, opt in flags(command).items() if flag in shared} == \
            {flag: opt.field for flag, opt in shared.items()}
        assert flags(command)["--reward-type"].field.metadata["choices"] is REWARD_TYPES


def test_dapos_filter_asks_the_kind_for_a_verdict(kinds, tiny_model_dir, tmp_path):
    from coati.launcher.preflight import check_user_rewards

    argv = ["-m", tiny_model_dir, "-d", rows(tmp_path), "-a", "DAPO"]
    first = load_examples(rows(tmp_path), RowFormat(reward_type="words"))[0]
    with pytest.raises(ConfigError, match=r"no reward of this run defines correctness \(words grades without a "
                                          r"verdict\): .*set --correct-threshold"):
        check_user_rewards(config_from_args(build_parser().parse_args([*argv, "-rt", "words"]), None), first)
    check_user_rewards(config_from_args(build_parser().parse_args(
        [*argv, "-rt", "words", "--correct-threshold", "0.5"]), None), first)
    check_user_rewards(config_from_args(build_parser().parse_args([*argv, "-rt", "exact_string"]), None), first)
