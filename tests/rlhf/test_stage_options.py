"""``coati sft`` / ``coati rm`` options: flags and YAML from one dataclass, precedence, and one error line for
every bad option, file or row, before any model is built."""

import json

import pytest

from coati import cli
from coati.config.stage import RMConfig, SFTConfig
from coati.utils.dataclass_cli import ConfigFileError, build_parser, parse


def test_flags_come_from_the_dataclass_with_short_aliases():
    parser = build_parser(SFTConfig, "coati sft", "")
    flags = {tuple(action.option_strings) for action in parser._actions}
    for pair in (("-lr", "--learning-rate"), ("-bs", "--batch-size"), ("-tmbs", "--micro-batch-size", "--train-microbatch-size"),
                 ("-t", "--num-trainers"), ("-zero", "--zero-stage"), ("-m", "--model"), ("-d", "--dataset"),
                 ("--config",), ("--progress", "--no-progress", "--progress-bar", "--no-progress-bar"), ("--max-grad-norm",)):
        assert pair in flags, pair
    help_text = parser.format_help()
    assert "AdamW learning rate" in help_text and "(default: 32)" in help_text
    assert "preference pairs per optimizer step" in build_parser(RMConfig, "coati rm", "").format_help()


def test_yaml_then_flags(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("learning_rate: 1e-4\nbatch-size: 16\nmodel: /m\nplugin: colossalai\neval_dataset: null\n")
    config = parse(SFTConfig, ["--config", str(path), "-bs", "8"], "coati sft", "")
    assert config.learning_rate == 1e-4 and config.model == "/m" and config.plugin == "colossalai"
    assert config.batch_size == 8  # the flag wins over the file
    assert parse(SFTConfig, [], "coati sft", "").batch_size == 32  # the field default


@pytest.mark.parametrize("text, message", [
    ("lr: 0.1\n", "has unknown key 'lr' (did you mean 'learning_rate'?)"),
    ("batch_size: 2.5\n", "key 'batch_size' must be int, got 2.5"),
    ("epochs: true\n", "key 'epochs' must be int"),
    ("plugin: deepspeed\n", "key 'plugin' must be one of torch, colossalai"),
    ("- 1\n- 2\n", "must be a mapping of option: value"),
    ("a: [1\n", "is not valid YAML"),
])
def test_bad_config_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as info:
        parse(SFTConfig, ["--config", str(path)], "coati sft", "")
    assert message in str(info.value) and "\n" not in str(info.value)


def run(argv, capsys):
    code = cli.main(argv)
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("argv, message", [
    (["sft", "-bs", "3", "-t", "2", "-m", "x"], "-bs (3) must be a multiple of the 2 data-parallel trainers"),
    (["sft", "-bs", "4", "-tmbs", "8"], "-bs / data-parallel trainers (4) must be >= -tmbs (8)"),
    (["sft", "-lr", "0"], "-lr/--learning-rate must be > 0"),
    (["rm", "--health", "entropy_min=0.1,grad_spike=3"], "--health: entropy_min: no such monitor in coati rm; its "
                                                         "keys: grad_spike, window, quiet_steps"),
    (["sft", "--health", "grad_spik=3"], "--health: unknown key 'grad_spik' (did you mean 'grad_spike'?)"),
    (["sft", "--weight-decay", "-1"], "--weight-decay must be >= 0, got -1.0"),
    (["rm", "--lr-warmup-ratio", "1"], "--lr-warmup-ratio must lie in [0, 1)"),
    (["sft", "--eval-fraction", "1"], "--eval-fraction must lie in [0, 1)"),
    (["rm", "-t", "2", "-pp", "2", "-bs", "8", "-tmbs", "2"], "only know the LM head, not its scalar head: drop -tp/-pp"),
    (["rm", "-t", "2", "-tp", "2"], "only know the LM head, not its scalar head: drop -tp/-pp"),
    (["sft", "-t", "2", "-zero", "2", "--precision", "fp16"], "torch-fsdp2 trains in fp32 or bf16 (fp16 needs a loss scaler"),
    (["sft", "--config", "missing.yaml"], "--config file not found: missing.yaml"),
    (["rm", "-m", "/no/such/model"], "model directory not found or without config.json: /no/such/model"),
])
def test_bad_options_give_one_line_before_any_work(argv, message, capsys):
    code, err = run(argv, capsys)
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert message in err, err


def test_bad_rows_stop_the_stage_with_file_and_line(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n"
                    + json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n")
    code, err = run(["rm", "-m", tiny_model_dir, "-d", str(data), "-sd", str(tmp_path)], capsys)
    assert code == 2 and err == f'error: {data}:2: missing "rejected" (rows are {{"prompt": ..., "chosen": "...", ' \
                                '"rejected": "..."}; this row has prompt, chosen)', err
    assert not (tmp_path / "rm" / "metrics.jsonl").exists()  # nothing started
