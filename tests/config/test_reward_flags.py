"""--reward-fn / --reward-weights / --reward-url: the flags reach the config, and every bad function or server is
one error line at start-up (exit 2), before any actor."""

import json
import os
import socket

import pytest

import rl_example
from coati.config.cli import build_parser, config_from_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "rewards", "length_penalty.py")


def data(tmp_path, n=64):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"messages": f"{i}+1=", "gt_answer": str(i + 1), "level": i}) + "\n"
                            for i in range(n)))
    return str(path)


def run_cli(argv, capsys):
    code = rl_example.main(argv)
    return code, capsys.readouterr().err.strip()


def test_flags_repeat_and_reach_the_scorer_options(tiny_model_dir, tmp_path):
    argv = ["-m", tiny_model_dir, "-d", data(tmp_path), "--reward-fn", f"{EXAMPLE}:length_penalty",
            "--reward-fn", f"{EXAMPLE}:exact_label", "--reward-weights", "boxed:1,length_penalty:0.5",
            "--reward-url", "http://127.0.0.1:9/score", "--reward-url-timeout", "5", "--reward-url-retries", "1"]
    config = config_from_args(build_parser().parse_args(argv), None)
    options = config.data.scorer_options()
    assert options["reward_fns"] == (f"{EXAMPLE}:length_penalty", f"{EXAMPLE}:exact_label")
    assert options["reward_weights"] == "boxed:1,length_penalty:0.5" and options["reward_url"].endswith("/score")
    assert options["remote_options"] == {"timeout_s": 5.0, "retries": 1}
    default = config_from_args(build_parser().parse_args(["-m", tiny_model_dir, "-d", data(tmp_path)]), None)
    assert default.data.reward_fn == () and default.data.reward_url is None


def test_yaml_list_of_reward_functions(tiny_model_dir, tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"reward_fn:\n  - {EXAMPLE}:length_penalty\n  - {EXAMPLE}:exact_label\n")
    config = config_from_args(build_parser().parse_args(
        ["--config", str(yaml_file), "-m", tiny_model_dir, "-d", data(tmp_path)]), None)
    assert config.data.reward_fn == (f"{EXAMPLE}:length_penalty", f"{EXAMPLE}:exact_label")


@pytest.mark.parametrize("source, spec, message", [
    (None, "missing.py:f", "--reward-fn missing.py:f: file not found: missing.py"),
    ("def f(response, label, row):\n    return 1\n", "{path}:g", "has no 'g' (functions there: f)"),
    ("def f(response):\n    return 1\n", "{path}:f", "cannot take (response, label, row)"),
    ("def f(response, label, row):\n    return row['missing']\n",
     "{path}:f", "raised on {data}:1 (the check call at start-up): KeyError: 'missing'"),
    ("def f(response, label, row):\n    return float('nan')\n", "{path}:f", "returned nan"),
    ("def f(response, label, row):\n    return 'yes'\n", "{path}:f", "returned str 'yes'; return a number"),
    ("def f(response, label, row):\n    return 1.0, {'correct': 'yes'}\n", "{path}:f",
     "(the check call at start-up) returned {{'correct': 'yes'}} (str); 'correct' must be True or False"),
    ("def f(response, label, row):\n    return (1.0,)\n", "{path}:f", "returned a tuple of 1"),
])
def test_bad_reward_function_is_one_line(tiny_model_dir, tmp_path, capsys, source, spec, message):
    path = tmp_path / "user_reward.py"
    if source is not None:
        path.write_text(source)
    train = data(tmp_path)
    code, err = run_cli(["-m", tiny_model_dir, "-d", train, "--reward-fn", spec.format(path=path)], capsys)
    assert code == 2 and err.count("\n") == 0 and err.startswith("error: "), err
    assert message.format(data=train) in err


def test_the_check_call_sees_the_first_row(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "r.py"
    path.write_text("def f(response, label, row):\n    assert (response, label, row['level']) == "
                    "('\\\\boxed{1}', '1', 0), (response, label, row)\n    return 0.0\n")
    config = config_from_args(build_parser().parse_args(
        ["-m", tiny_model_dir, "-d", data(tmp_path), "--reward-fn", f"{path}:f"]), None)
    from coati.launcher.preflight import check_inputs

    check_inputs(config)  # raises ConfigError if the assertion in f failed


@pytest.mark.parametrize("argv, message", [
    (["--reward-weights", "boxed"], "--reward-weights item 'boxed' must be name:weight"),
    (["--reward-weights", "length:1"], "'length', which is no reward of this run (rewards: boxed)"),
    (["--reward-url", "localhost:80"], "--reward-url 'localhost:80' must be http://HOST:PORT/PATH"),
    (["--reward-url", "http://127.0.0.1:1/x", "--reward-url-timeout", "0"], "--reward-url-timeout must be > 0"),
])
def test_bad_reward_flags(tiny_model_dir, tmp_path, capsys, argv, message):
    code, err = run_cli(["-m", tiny_model_dir, "-d", data(tmp_path), *argv], capsys)
    assert code == 2 and err.count("\n") == 0 and message in err, err


def test_reward_server_down_at_start_up_is_one_line(tiny_model_dir, tmp_path, capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, err = run_cli(["-m", tiny_model_dir, "-d", data(tmp_path), "--reward-url", f"http://127.0.0.1:{port}/s",
                         "--reward-url-retries", "0"], capsys)
    assert code == 2 and err.count("\n") == 0, err
    assert f"reward server http://127.0.0.1:{port}/s is down:" in err and "(1 tries)" in err


@pytest.mark.parametrize("source, extra, refused", [
    ("return 1.0", [], True),  # boxed weighs 0 and nothing says what is correct
    ("return 1.0, {'correct': True}", [], False),
    ("return 1.0", ["--correct-threshold", "0.5"], False),
])
def test_dapo_filter_needs_correctness(tiny_model_dir, tmp_path, capsys, source, extra, refused):
    path = tmp_path / "user_reward.py"
    path.write_text(f"def f(response, label, row):\n    {source}\n")
    config = config_from_args(build_parser().parse_args(
        ["-m", tiny_model_dir, "-d", data(tmp_path), "-a", "DAPO", "--reward-fn", f"{path}:f",
         "--reward-weights", "boxed:0", *extra]), None)
    from coati.config.errors import ConfigError
    from coati.launcher.preflight import check_user_rewards
    from coati.dataset.loader import load_examples

    first = load_examples(config.data.train_path, config.data.rows)[0]
    if refused:
        with pytest.raises(ConfigError, match="filter_range keeps groups by accuracy, but no reward of this run "
                                              "defines correctness"):
            check_user_rewards(config, first)
    else:
        check_user_rewards(config, first)
