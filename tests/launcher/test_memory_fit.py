"""The memory plan chooses the knobs the user left to it (coati/launcher/plan.py ``fit_memory``), at real model
shapes: SmolLM2-135M's and Qwen2.5-0.5B's; --dry-run and a run's start choose alike, and flags that cannot fit are
one line with the -tmbs that would."""

import json
import re

import pytest

from coati.cluster.memory import CPU_RUNTIME, GiB, MemoryLayout, ModelShape, inferencer_memory, trainer_memory
from coati.launcher.plan import MARGIN, PlanError, build_plan, dry_run, fit_for_start, grow, parse_cluster
from coati.train import main

SMOLLM2_135M = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "tie_word_embeddings": True, "max_position_embeddings": 8192}
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
              "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "tie_word_embeddings": True, "max_position_embeddings": 32768}


def model_inputs(tmp_path, name, shape):
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(shape))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"messages": {"role": "user", "content": f"{i}+1="}, "gt_answer": str(i + 1)})
                            + "\n" for i in range(64)))
    return ["-m", str(model), "-d", str(data)]


@pytest.fixture
def smol(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return model_inputs(tmp_path, "smollm2", SMOLLM2_135M)


@pytest.fixture
def half_b(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return model_inputs(tmp_path, "qwen05b", QWEN25_05B)


def config_of(argv):
    from coati.config.cli import build_parser, config_from_args

    parser = build_parser()
    return config_from_args(parser.parse_args(argv), given=parser.given)


def test_the_cheaper_knob_climbs_first_until_neither_fits():
    # memory 3 per trainer sample + 1 per engine sample, room 20: (1,1) 4 -> e2 5 -> e4 7 -> t2 10 -> e8 14 -> t4 20
    rungs = [[{"t": n} for n in (1, 2, 4, 8)], [{"e": n} for n in (1, 2, 4, 8, 16)]]
    values = {"t": (1, 2, 4, 8), "e": (1, 2, 4, 8, 16)}

    def measure(at):
        need = 3 * values["t"][at[0]] + values["e"][at[1]]
        return need <= 20, need

    assert grow(rungs, measure) == [2, 3]  # -tmbs 4, 8 engine samples


def node_need(shape, tmbs, samples, seq=1536, new=1024):
    """This node's estimate by hand from the memory model: the trainer (fp32, no reference, the sender's publish
    copies), the transformers inferencer (``samples`` a call: -imbs prompts x G), the driver, buffer and weight store."""
    trainer = trainer_memory(shape, MemoryLayout(), tmbs, seq)["total"] + 2 * 4 * shape.params
    engine = inferencer_memory(shape, "transformers", "fp32", 1, 0.0, samples, seq, new)["total"]
    return trainer + engine + 3 * CPU_RUNTIME


def test_smollm2_without_batch_flags_fits_a_24_gb_cpu_node_and_says_what_it_chose(smol):
    lines, error = dry_run(config_of(smol), "1x0x24x2")
    assert error is None
    assert lines[0].startswith("memory plan: trainer micro-batch 2 samples (-tmbs), transformers engine 1 prompt "
                               "(8 samples) per generate call (-imbs): ")
    assert "20% for the estimate's error" in lines[0] and lines[0].endswith("--dry-run for details")
    shape, room = ModelShape.from_config(SMOLLM2_135M), (1 - MARGIN) * parse_cluster("1x0x24x2")[0].memory
    assert node_need(shape, 2, 8) <= room  # the choice keeps the margin ...
    assert node_need(shape, 4, 8) > room and node_need(shape, 2, 16) > room  # ... and neither knob can climb
    assert f"{node_need(shape, 2, 8) / GiB:.1f} of 22.4 GiB on node 0" in lines[0]


def test_smollm2_on_one_gpu_and_an_explicit_ibs(smol):
    lines, error = dry_run(config_of([*smol, "-ibs", "8"]), "1x1x24")
    assert error is None and lines[0].startswith("one GPU:")  # colocated: the larger phase counts
    assert "trainer micro-batch 4 samples (-tmbs), transformers engine 2 prompts (16 samples) per generate call" in lines[1]


def test_a_given_knob_stays_exact_and_the_other_follows_the_room(smol):
    lines, error = dry_run(config_of([*smol, "-tmbs", "1"]), "1x0x24x2")
    assert error is None and lines[0].startswith("memory plan: transformers engine 1 prompt (8 samples) per generate call")
    shape, room = ModelShape.from_config(SMOLLM2_135M), (1 - MARGIN) * parse_cluster("1x0x24x2")[0].memory
    assert node_need(shape, 1, 8) <= room < node_need(shape, 1, 16)


def test_vllm_on_cpu_gets_its_kv_budget_chosen(smol):
    lines, error = dry_run(config_of([*smol, "-b", "vllm"]), "1x0x24x2")
    assert error is None and lines[0].startswith("memory plan: trainer micro-batch 2 samples (-tmbs), vLLM KV cache "
                                                 "1 GiB (--vllm-kv-cache-gb): ")  # the default fits
    lines, error = dry_run(config_of([*smol, "-b", "vllm", "-tmbs", "3"]), "1x0x23x2")
    # 16.85 GiB besides the KV cache, 80% of 23 GB = 17.14 GiB: halved twice to 0.25 GiB (the floor: one 1536-token
    # fp32 sequence, 0.066 GiB)
    assert error is None and lines[0].startswith("memory plan: vLLM KV cache 0.25 GiB (--vllm-kv-cache-gb): 17.1 of")


def test_the_half_b_shape_fits_one_80_gb_gpu_but_no_24_gb_cpu_node(half_b, capsys):
    lines, error = dry_run(config_of(half_b), "1x1x80")
    assert error is None and lines[1].startswith("memory plan: trainer micro-batch 4 samples (-tmbs), transformers "
                                                 "engine 2 prompts (16 samples) per generate call (-imbs)")
    assert main([*half_b, "--dry-run-cluster", "1x0x24x2"]) == 1
    out, err = capsys.readouterr()
    assert "memory plan" not in out  # even one sample does not fit: no choice to announce
    assert err.count("\n") == 1 and err.startswith("error: node 0 needs ") and \
        err.rstrip().endswith("or add nodes (or --gradient-checkpointing)")


def test_explicit_flags_that_cannot_fit_are_one_line_with_flags_that_do(smol, capsys):
    assert main([*smol, "-tmbs", "64", "--dry-run-cluster", "1x0x24x2"]) == 1
    err = capsys.readouterr().err
    # (the GiB follow the engine the run would take: vLLM where it is installed, as on CI, else transformers)
    assert err.count("\n") == 1 and re.match(r"error: node 0 needs 18\d\.\d GiB", err) and \
        err.rstrip().endswith(": try -tmbs 2 (or --gradient-checkpointing)")


def test_a_start_refuses_what_cannot_fit_and_chooses_as_dry_run_does(smol):
    with pytest.raises(PlanError, match=r": try -tmbs \d+"):
        fit_for_start(config_of([*smol, "-tmbs", "256", "-imbs", "1"]))  # this machine: far below 700 GiB
    started = fit_for_start(config_of(smol))
    config, lines, *_ = build_plan(config_of(smol))
    assert started.line in lines and started.config.batch == config.batch
