"""Environments named on the command line, tool schemas, and the user example in examples/."""

import os

import pytest
import torch

from coati.config.sampling import SamplingParams
from coati.dataset.rows import Example
from coati.rollout.env import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, EnvLoadError, PythonToolEnv, load_env, make_env
from coati.rollout.episode import EpisodeBudget, episode_groups
from coati.rollout.inference_backend import TransformersBackend
from coati.rollout.tools import ToolError, Toolbox, tool_schema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "calculator_env.py")


def test_registry_name_and_file_spec():
    assert load_env("python_tool") is PythonToolEnv
    cls = load_env(f"{EXAMPLE}:CalculatorEnv")
    assert cls.__name__ == "CalculatorEnv"


@pytest.mark.parametrize("spec, words", [
    ("nonesuch", "not a registered environment"),
    ("missing/file.py:Env", "no file"),
    (f"{EXAMPLE}:Nope", "has no class 'Nope' (environment classes there: CalculatorEnv)"),
])
def test_bad_env_spec_is_one_line(spec, words):
    with pytest.raises(EnvLoadError) as err:
        load_env(spec)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_env_file_that_fails_to_import_or_lacks_step(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(EnvLoadError, match="importing .* failed: ModuleNotFoundError"):
        load_env(f"{broken}:Env")
    lacking = tmp_path / "lacking.py"
    lacking.write_text("class Env:\n    def reset(self, row):\n        return None\n")
    with pytest.raises(EnvLoadError, match="lacks step"):
        load_env(f"{lacking}:Env")
    bad_tool = tmp_path / "bad_tool.py"
    bad_tool.write_text("from coati.rollout.env import ToolEnv\ndef f(x):\n    'doc'\n    return x\n"
                        "class Env(ToolEnv):\n    tools = [f]\n")
    with pytest.raises(EnvLoadError, match="parameter 'x' needs a type annotation"):
        make_env(load_env(f"{bad_tool}:Env"))


def test_schema_from_signature_and_docstring():
    def lookup(city: str, days: int = 1, metric: bool = True) -> str:
        """Weather forecast for a city.

        Args:
            city: the city's name
            days: how many days ahead
        """
        return city

    schema = tool_schema(lookup)["function"]
    assert schema["name"] == "lookup" and schema["description"] == "Weather forecast for a city."
    assert schema["parameters"]["required"] == ["city"]
    assert schema["parameters"]["properties"] == {"city": {"type": "string", "description": "the city's name"},
                                                  "days": {"type": "integer", "description": "how many days ahead"},
                                                  "metric": {"type": "boolean"}}
    with pytest.raises(ToolError, match="no docstring"):
        tool_schema(lambda x: x)
    box = Toolbox([lookup])
    assert box.call('{"name": "lookup", "arguments": {"city": "Oslo", "days": "2"}}')[1].text == \
        "error: argument 'days' must be of JSON type integer"


def test_user_example_env_runs_episodes(tiny_model_dir):
    cls = load_env(f"{EXAMPLE}:CalculatorEnv")
    row = Example(({"role": "user", "content": "123*456="},), gt_answer="56088", source="x:1")
    env = make_env(cls)
    env.reset(row)
    result = env.step("I will call " + TOOL_CALL_OPEN + '{"name": "multiply", "arguments": {"a": 123, "b": 456}}'
                      + TOOL_CALL_CLOSE)
    assert not result.done and "56088" in result.observation and result.info["tool_call"] == "multiply"
    assert env.step("so \\boxed{56088}").reward == 1.0 and env.step("\\boxed{56089}").reward == 0.0
    assert "multiply" in env.tool_prompt()
    torch.manual_seed(0)
    backend = TransformersBackend.from_pretrained(tiny_model_dir)
    ids = backend.tokenizer("123*456=").input_ids
    groups = episode_groups(backend, lambda: make_env(cls), [(row, "123*456=", ids)],
                            SamplingParams(n=2, max_new_tokens=8, seed=0), EpisodeBudget(2, 2, 64), version=3)
    assert len(groups) == 1 and len(groups[0].responses) == 2 and groups[0].policy_version == 3
    assert all(len(m) == len(r) for m, r in zip(groups[0].loss_masks, groups[0].responses))


def test_env_flag_combinations_refused():
    from coati.config.cli import build_parser, config_from_args
    from coati.config.errors import ConfigError

    base = ["-m", "/nonexistent", "-d", "x.jsonl", "--env", "python_tool"]
    for extra, words in ((["-a", "PPO", "--reward-model", "/rm"], "drop --reward-model"),
                         (["--max-episode-tokens", "0"], "--max-episode-tokens must be at least 1"),
                         (["--max-tool-calls", "-1"], "--max-tool-calls must be >= 0")):
        with pytest.raises(ConfigError, match=words):
            config_from_args(build_parser().parse_args(base + extra))
