"""``--dry-run`` checks every input a real start checks (files, keys, reward functions, --resume, the model) and
probes a cluster it is pointed at, so a plan that says "fits" is a run that starts. ``python -m
coati.cluster.connect`` says its default wait and reports progress while it waits."""

from __future__ import annotations

import json

import pytest

from coati.cluster import connect
from coati.train import main
from tests.ray_nodes import free_port


def rows(path, n=64):
    path.write_text("".join(json.dumps({"messages": {"role": "user", "content": f"{i}+1="}, "gt_answer": str(i + 1)})
                            + "\n" for i in range(n)))
    return str(path)


@pytest.fixture
def small(tiny_model_dir, tmp_path, monkeypatch):
    """A user's model and data with batches the data holds; the run directory under tmp_path."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return ["-m", tiny_model_dir, "-d", rows(tmp_path / "d.jsonl"), "-ibs", "8", "-imbs", "8", "-tbs", "8", "-tMbs",
            "8", "-g", "2", "-tmbs", "16", "-mnt", "8", "-sd", str(tmp_path / "runs")]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_dry_run_of_good_inputs_fits(small, capsys):
    assert main([*small, "--dry-run"]) == 0
    assert "fits:" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["-d", "nothing.jsonl"], "nothing.jsonl"),
    (["--reward-fn", "no_such_file.py:fn"], "no_such_file.py"),
    (["--resume", "latest"], "--resume latest: no complete checkpoint under"),
    (["-ibs", "128", "-imbs", "128"], "each of the 1 inferencers needs at least -ibs=128"),
])
def test_dry_run_refuses_what_a_start_refuses(small, extra, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*small, *extra, "--dry-run"]) == 2
    assert message in one_error_line(capsys)


def test_dry_run_against_a_closed_port_is_the_probe_line(small, capsys):
    port = free_port()  # free now: nothing listens there
    assert main([*small, "--master_address", f"127.0.0.1:{port}", "--dry-run"]) == 1
    assert one_error_line(capsys).startswith(f"error: no Ray head at 127.0.0.1:{port} (--master_address): nothing "
                                             "listens there")


def test_wait_for_nodes_states_its_default_and_reports_progress(capsys):
    with pytest.raises(SystemExit):
        connect.main(["--help"])
    assert "(default: 300)" in " ".join(capsys.readouterr().out.split())
    port = free_port()
    assert connect.main([f"127.0.0.1:{port}", "--nodes", "2", "--timeout", "3"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"waiting up to 3 s for 2 alive node(s) at 127.0.0.1:{port}"
    assert err[1].startswith(f"no head answers yet at 127.0.0.1:{port} (0 s of 3 s)")
    assert err[-1].startswith(f"error: no Ray head answers at 127.0.0.1:{port} after 3 s")


def test_a_model_file_says_it_is_a_file(small, tiny_model_dir, capsys):
    weights = f"{tiny_model_dir}/config.json"
    assert main([*small, "-m", weights, "--dry-run"]) == 2
    assert one_error_line(capsys) == (f"error: -m/--model {weights} is a file: pass the directory that holds it and "
                                      "the model's config.json (written by save_pretrained)")


def test_lengths_beyond_the_models_positions_are_refused_before_a_start(small, tiny_model_dir, capsys):
    assert main([*small, "-mpt", "512", "-mnt", "1600"]) == 2  # the tiny model has 2048 positions
    assert one_error_line(capsys) == (f"error: -mpt 512 + -mnt 1600 = 2112 tokens exceed the model's 2048 positions "
                                      f"(max_position_embeddings in {tiny_model_dir}/config.json): lower -mnt or -mpt")


def expected_engine(model_dir) -> str:
    """The engine this machine should choose for a user's model: vLLM where installed and serving it."""
    from coati.launcher.preflight import model_architectures
    from coati.rollout.vllm_backend import vllm_offer

    offer = vllm_offer(model_architectures(model_dir))
    return "vllm" if offer.serves and offer.unusable is None else "transformers"


def test_a_users_model_without_b_names_its_engine_and_the_plan_uses_it(small, tiny_model_dir, capsys):
    assert main([*small, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    engine = expected_engine(tiny_model_dir)
    assert out[0].startswith(f"engine: {engine} (") and out[0].endswith(" to change)"), out[0]
    assert f"1 {engine} inferencer(s)" in "\n".join(out)


def test_b_given_keeps_its_engine_without_a_line(small, capsys):
    assert main([*small, "-b", "transformers", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "engine:" not in out and "1 transformers inferencer(s)" in out


def test_a_real_start_prints_the_same_line_once_the_cluster_is_joined(small, capsys, monkeypatch):
    """The line a start prints is the dry run's; it comes after the cluster is joined (a head that cannot be
    reached stays one error line: tests/cluster/test_cluster.py). The run is cut short by an injected failure
    to place its actors."""
    import ray

    import coati.launcher.rl as rl
    from coati.cluster.connect import ClusterError

    assert main([*small, "--dry-run"]) == 0
    planned = capsys.readouterr().out.splitlines()
    dry = planned[0]
    # so is the line on what a template-less tokenizer makes of the prompts, before any actor is placed
    prompts = [line for line in planned if line.startswith("prompts: ")]

    def no_room(config, timeout_s=0):
        raise ClusterError("injected: no room for the actors")

    monkeypatch.setattr(rl, "reserve", no_room)
    try:
        assert main(small) == 1
    finally:
        ray.shutdown()
    started = capsys.readouterr().out.splitlines()
    assert dry in started
    assert len(prompts) == 1 and prompts[0] in started


def test_the_python_api_chooses_as_the_command_does(tiny_model_dir, tmp_path):
    from coati.api import build_config

    data = rows(tmp_path / "d.jsonl")
    assert build_config(model=tiny_model_dir, dataset=data).parallel.backend == expected_engine(tiny_model_dir)
    assert build_config(model=tiny_model_dir, dataset=data, backend="transformers").parallel.backend == "transformers"


def test_a_system_prompt_on_a_model_without_a_chat_template_is_one_line(small, tiny_model_dir, capsys):
    """The tiny model's tokenizer has no chat template and the boxed reward's system prompt applies: a base model
    would see it and the row joined as raw text. Said in --dry-run (and as a start begins, before any actor:
    test_a_real_start_prints_the_same_line_once_the_cluster_is_joined), and not with a template."""
    assert main([*small, "--dry-run"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("prompts: ")]
    assert len(said) == 1 and said[0].startswith(f"prompts: {tiny_model_dir} has no chat template: each prompt is "
                                                 "the system prompt "), said
    assert "and its row's text as plain text" in said[0] and "--prompt-template" in said[0]
    assert main([*small, "--prompt-template", "{system}\nQ: {prompt}\nA:", "--stop", "\nQ:", "--dry-run"]) == 0
    assert "prompts: " not in capsys.readouterr().out


def test_a_base_models_template_and_stops_reach_training_and_evaluation(small):
    from coati.config.cli import build_parser, config_from_args

    config = config_from_args(build_parser().parse_args([*small, "--prompt-template", "Q: {prompt}\nA:", "--stop",
                                                         "\nQ:", "--stop", "\n\n"]))
    assert config.data.prompt_template == "Q: {prompt}\nA:" and config.data.system_prompt == ""  # the template's own
    assert config.sampling.stop_strings[-2:] == ("\nQ:", "\n\n")
    assert all(params.stop_strings == config.sampling.stop_strings for _, params in config.eval_sampling)


@pytest.mark.parametrize("extra, message", [
    (["--prompt-template", "Q: {question}\nA:"], "--prompt-template 'Q: {question}\\nA:' has no {prompt}: write"),
    (["--prompt-template", "Q: {prompt}\nA:", "-s", "Be brief."],
     "-s/--system-prompt is given but --prompt-template 'Q: {prompt}\\nA:' has no {system}: put {system} where it "
     "goes, or leave -s out"),
    (["--stop", ""], "--stop needs a text to stop at, got an empty string"),
])
def test_a_bad_template_or_stop_is_one_line(small, extra, message, capsys):
    assert main([*small, *extra, "--dry-run"]) == 2
    assert message in one_error_line(capsys)


def test_whether_a_saved_tokenizer_has_a_chat_template_is_read_from_its_files(tmp_path):
    from coati.launcher.preflight import chat_template_of
    from coati.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path / "plain")
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    tokenizer.save_pretrained(tmp_path / "chat")
    assert chat_template_of(str(tmp_path / "plain")) is False and chat_template_of(str(tmp_path / "chat")) is True
    assert chat_template_of(str(tmp_path)) is None  # no tokenizer saved there: nothing to say


def test_chat_rows_of_several_messages_are_said_and_single_messages_are_not(small, tmp_path, capsys):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "system", "content": "Numbers only."},
                                                      {"role": "user", "content": f"{i}+1="}],
                                         "gt_answer": str(i + 1)}) + "\n" for i in range(64)))
    data = small.index("-d") + 1
    assert main([*small[:data], str(chats), *small[data + 1:], "-s", "", "--dry-run"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("prompts: ")]
    assert len(said) == 1 and "each prompt is its row's chat messages as plain text" in said[0], said
    assert main([*small, "-s", "", "--dry-run"]) == 0  # one user message each, no system prompt: the text as is
    assert "prompts: " not in capsys.readouterr().out
