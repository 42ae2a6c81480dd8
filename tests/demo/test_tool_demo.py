"""The tool demo's task, tokenizer, warm-start batches, environments and flags (the GRPO gain itself:
tests/e2e/test_tool_demo_e2e.py)."""

import json

from transformers import AutoTokenizer

import rl_example
from coati.config.cli import build_parser, config_from_args
from coati.dataset.jsonl import Example
from coati.dataset.tool_demo_task import TOOL_WORD_TOKENS, call_text, episode_texts, prompt_text, response_text
from coati.demo.tool_demo import ToolDemoRecipe, episode_batch
from coati.models.tiny import build_char_tokenizer, build_tiny_model, save_tiny
from coati.rollout.env import MultiplyEnv, MultiplyOffEnv, load_env


def test_the_task_texts_are_what_the_environment_reads_and_writes():
    env = MultiplyEnv()
    env.reset(Example(messages=(), gt_answer=str(123 * 456)))
    called = env.step(call_text(123, 456))
    assert called.observation == response_text(123, 456) and called.info["tool_call"] == "multiply"
    assert not called.info["tool_error"] and not called.done
    answer = episode_texts(123, 456, use_tool=True)[-1][0]
    assert env.step(answer).reward == 1.0 and env.step("\\boxed{56000}").reward == 0.0
    assert env.tool_prompt() == ""  # the demo's prompt is the bare problem
    off = MultiplyOffEnv()
    off.reset(Example(messages=(), gt_answer="56088"))
    failed = off.step(call_text(123, 456))
    assert failed.info["tool_error"] and "calculator is off" in failed.observation and "56088" not in failed.observation
    assert load_env("tool_demo") is MultiplyEnv and load_env("tool_demo_off") is MultiplyOffEnv


def test_tokenizer_keeps_the_call_syntax_whole(tmp_path):
    tokenizer = build_char_tokenizer(word_tokens=TOOL_WORD_TOKENS)
    save_tiny(build_tiny_model(ToolDemoRecipe().spec, tokenizer), tokenizer, str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = prompt_text(123, 456) + "".join(piece for piece, _ in episode_texts(123, 456, use_tool=True))
    ids = loaded(text).input_ids
    assert ids == tokenizer(text).input_ids and loaded.unk_token_id not in ids
    assert loaded.decode(ids) == text
    assert len(loaded(call_text(123, 456)).input_ids) == 9  # 3 fixed tokens and 6 digits


def test_warm_start_batches_train_only_the_models_tokens():
    tokenizer = build_char_tokenizer(word_tokens=TOOL_WORD_TOKENS)
    input_ids, attention, labels = episode_batch([(123, 456, True), (321, 654, False)], tokenizer)
    trained = tokenizer.decode([int(t) for t in labels[0] if t >= 0], skip_special_tokens=True)
    assert trained == call_text(123, 456) + "\\boxed{56088}"
    assert tokenizer.decode([int(t) for t in labels[1] if t >= 0], skip_special_tokens=True) == "\\boxed{209934}"
    assert int(attention[1].sum()) < input_ids.shape[1] and labels[0][-1] == tokenizer.eos_token_id


def _config(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), rl_example._placeholder_demo())


def test_env_tool_demo_without_a_model_is_the_tool_demo(capsys):
    config = _config("--env", "tool_demo")
    assert list(config.data.eval_paths) == ["multiply"] and config.sampling.max_new_tokens == 12
    assert config.batch.inference_batch_size == 32 and config.run.num_episodes == 1
    assert list(_config("--env", "python_tool").data.eval_paths) == ["addition"]
    assert rl_example.main(["--env", "tool_demo", "-rt", "code"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "drop -rt code" in err, err


def test_eval_rows_carry_the_tool_use_rate_only_for_episodes():
    from coati.rollout.evaluation import EvalResult

    assert "tool_use_rate" not in EvalResult(0.5, 1.0, 0.5).summary()
    assert EvalResult(0.5, 1.0, 0.5, tool_use_rate=0.25).summary()["tool_use_rate"] == 0.25


def test_tool_use_is_printed_from_the_eval_rows(tmp_path, capsys):
    from coati.train import print_tool_use

    rows = [{"step": 0, "kind": "eval", "task": "multiply", "mode": "greedy", "tool_use_rate": 0.0},
            {"step": 3, "kind": "train", "tool_use_rate": 0.5},
            {"step": 8, "kind": "eval", "task": "multiply", "mode": "greedy", "tool_use_rate": 0.75}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print_tool_use(str(path), 8)
    assert capsys.readouterr().out == "held-out tool-use rate multiply/greedy: 0.000 -> 0.750 (+75.0 points)\n"
