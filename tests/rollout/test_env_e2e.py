"""A user's environment file named with --env trains through the real system (Ray producers and trainers)."""

import json
import os

import pytest
import ray

from coati.config.cli import build_parser, config_from_args
from coati.rollout.env import boxed_answer
from tests.run_helpers import head

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "examples", "calculator_env.py")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_env_file_from_the_command_line_trains(demo_assets, tmp_path):
    from coati.launcher.preflight import check_inputs
    from coati.launcher.rl import run

    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    argv = ["-d", train, "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "8", "-tMbs", "8", "-tmbs", "32", "-e", "1",
            "-sd", str(tmp_path / "runs"), "-p", "t", "--no-progress", "-ei", "0", "-rsd", str(tmp_path / "rollouts"),
            "--env", f"{EXAMPLE}:CalculatorEnv", "--max-turns", "3", "--max-episode-tokens", "48", "-mpt", "512"]
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    try:
        result = run(config, log=lambda message: None)
    finally:
        ray.shutdown()
    rows = [json.loads(line) for line in open(result.metrics_path)]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert result.steps == len(train_rows) >= 1
    for key in ("episode_turns", "tool_calls", "tool_use_rate", "tool_token_fraction"):
        assert all(key in r for r in train_rows), key
    assert all(r["episode_turns"] >= 1.0 for r in train_rows)
    print({k: train_rows[0][k] for k in ("reward", "episode_turns", "tool_calls", "tool_token_fraction")})
    logged = [json.loads(line) for root, _, names in os.walk(tmp_path / "rollouts") for name in names
              for line in open(os.path.join(root, name))]
    assert logged and all("turns" in r and r["turns"][0]["version"] >= 0 for r in logged)
    for record in logged:  # the environment graded what the model wrote in its last turn
        a, b = record["prompt"].splitlines()[-1].rstrip("=").split("+")
        answer = boxed_answer(record["turns"][-1]["model"]) if record["finish_reason"] == "stop" else None
        assert record["reward"] == float(answer == str(int(a) + int(b))), record


def test_bad_env_flag_is_one_line(capsys):
    import rl_example

    assert rl_example.main(["--env", "no/such/env.py:Env", "-e", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no file 'no/such/env.py'" in err, err
    assert rl_example.main(["--env", "python_tool", "--max-turns", "0"]) == 2
    assert "--max-turns must be at least 1" in capsys.readouterr().err
