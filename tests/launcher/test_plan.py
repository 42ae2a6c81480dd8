"""--dry-run: placement, threads, memory estimate and the fit check, on described clusters (no actor started)."""

import json

import pytest

from coati.launcher.plan import PlanError, dry_run, parse_cluster
from coati.train import main

QWEN7 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
         "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
         "tie_word_embeddings": False}
SEED_LAYOUT = ["-b", "vllm", "-i", "16", "-t", "16", "-tp", "4", "-pp", "2", "-zero", "1", "--plugin", "colossalai",
               "--precision", "bf16", "-tmbs", "4", "-mnt", "1024"]


@pytest.fixture
def seven_b(tmp_path):
    model = tmp_path / "qwen7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN7))
    data = tmp_path / "rows.jsonl"  # one full inference batch for each of 16 inferencers, as a start checks
    data.write_text((json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n") * 16 * 64)
    return ["-m", str(model), "-d", str(data), "--input-key", "question", "--label-key", "answer"]


def config_of(argv):
    from coati.config.cli import build_parser, config_from_args

    return config_from_args(build_parser().parse_args(argv))


def test_cluster_descriptions():
    nodes = parse_cluster("4x8x80")
    assert len(nodes) == 4 and nodes[0].gpus == 8 and nodes[0].memory == 80e9 and nodes[0].cpus == 96
    cpu = parse_cluster("1x0x24x2")
    assert cpu[0].gpus == 0 and cpu[0].cpus == 2 and cpu[0].memory == 24e9
    with pytest.raises(PlanError, match="NODESxGPUSxGB"):
        parse_cluster("4 nodes")


def test_seed_layout_places_trainers_on_two_nodes_and_inferencers_on_the_others(seven_b, capsys):
    assert main([*seven_b, *SEED_LAYOUT, "--dry-run-cluster", "4x8x80"]) == 0
    out = capsys.readouterr().out
    assert "TP 4 x PP 2 x DP 2, -zero 1, bf16" in out and "7.62B parameters" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("trainer rank", "inferencer"))]
    assert len(rows) == 32
    trainer_nodes = [int(r[3]) for r in rows if r[0] == "trainer"]  # "trainer rank R NODE GPU i ..."
    assert trainer_nodes == [0] * 8 + [1] * 8  # consecutive ranks (TP peers) share a node
    assert [r[5] for r in rows if r[0] == "trainer"] == [str(i) for i in range(8)] * 2
    assert sorted({int(r[2]) for r in rows if r[0] == "inferencer"}) == [2, 3]
    assert out.rstrip().endswith("fits: every actor's estimate is within its device's memory")


def test_seed_layout_numbers(seven_b):
    lines, error = dry_run(config_of([*seven_b, *SEED_LAYOUT]), "4x8x80")
    assert error is None
    rank0 = next(line for line in lines if line.startswith("trainer rank 0 "))
    # P/8 = 951.95M parameters per rank: bf16 weights + fp32 masters / dp 2 = 3.55 GiB; fp32 grads 3.55; Adam/2 3.55
    assert "weights 3.5, gradients 3.5, optimizer 3.5" in rank0
    # 4 samples x 1536 tokens x (8 x 3584 + (4 x 512 + 4 x 18944) / 4) x 2 bytes x 28 layers = 15.4 GiB
    assert "activations 15.4" in rank0
    inferencer = next(line for line in lines if line.startswith("inferencer 0 "))
    # bf16 weights 15.23e9 B = 14.2 GiB; KV budget 0.7 x 80e9 - weights = 38.0 GiB
    assert "weights 14.2, kv_cache 38.0" in inferencer


def test_a_layout_that_cannot_fit_is_one_error_line(seven_b, capsys):
    # one unsharded fp32 rank of a 7.6B model: 16 bytes per parameter = 113 GiB before activations
    assert main([*seven_b, "-t", "1", "-i", "1", "--dry-run-cluster", "1x8x80"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: trainer rank 0 needs") and "raise -tp/-pp or -zero" in err[0]


def test_too_few_gpus_is_the_placement_error(seven_b, capsys):
    assert main([*seven_b, *SEED_LAYOUT, "--dry-run-cluster", "2x8x80"]) == 2
    err = capsys.readouterr().err
    assert "needs 32 GPUs" in err and "the cluster has 16" in err


def test_cpu_node_sums_its_actors(seven_b):
    lines, error = dry_run(config_of([*seven_b, "-t", "2", "-zero", "3"]), "1x0x24x4")
    assert error.startswith("node 0 needs") and "has 22.4 GiB" in error
    assert any(line.startswith("trainer rank 1 ") and "1 CPU slot" in line for line in lines)


def test_a_cpu_evaluator_has_no_slot_but_its_memory_counts(seven_b, tmp_path):
    """On a CPU cluster the -ei evaluator shares the driver's node's cores (no bundle) but holds an engine of its own
    there: the plan counts it (Gemma 3 270M's held 5.6 GB beside the trainer and the inferencer)."""
    held_out = tmp_path / "eval.jsonl"
    held_out.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    evaluated = [*seven_b, "-b", "vllm", "-ed", json.dumps({"task": str(held_out)}), "-ei", "5"]
    lines, _ = dry_run(config_of(evaluated), "1x0x512x8")
    row = next(line for line in lines if line.startswith("evaluator "))
    engine = next(line for line in lines if line.startswith("inferencer 0 "))
    assert "shares cores" in row and "kv_cache" in row
    assert row.rsplit("  ", 2)[1:] == engine.rsplit("  ", 2)[1:]  # the same engine's estimate: total and parts
    for apart_from in (["-ei", "0"], ["--colocate"]):  # no evaluator actor: nothing counted
        lines, _ = dry_run(config_of([*evaluated, *apart_from]), "1x0x512x8")
        assert not any(line.startswith("evaluator ") for line in lines)


def test_vllm_weights_that_leave_no_kv_cache(seven_b):
    lines, error = dry_run(config_of([*seven_b, *SEED_LAYOUT, "--vllm-gpu-memory-utilization", "0.15"]), "4x8x80")
    assert error.startswith("inferencer 0: vLLM's weights") and "raise -ptp or the utilization" in error
    assert 0.15 * 80e9 < 2 * 7_615_616_512  # bf16 weights over the budget: no KV cache at all
    assert "kv_cache -" in next(line for line in lines if line.startswith("inferencer 0 "))


def test_gradient_checkpointing_shrinks_the_planned_activations(seven_b):
    torch_tp = ["-b", "vllm", "-i", "16", "-t", "16", "-tp", "4", "-zero", "1", "--precision", "bf16", "-tmbs", "4",
                "-mnt", "1024"]
    rank0 = {}
    for extra in ([], ["--gradient-checkpointing"]):
        lines, _ = dry_run(config_of([*seven_b, *torch_tp, *extra]), "4x8x80")
        rank0[bool(extra)] = next(line for line in lines if line.startswith("trainer rank 0 "))
    # 4 x 1536 tokens x 28 layers x (8 x 3584 + (4 x 512 + 4 x 18944) / 4) x 2 bytes
    assert "activations 15.4" in rank0[False]
    # 4 x 1536 tokens x (3584 x 28 layer inputs + one layer's 8 x 3584 + (4 x 512 + 4 x 18944) / 4) x 2 bytes
    assert "activations 1.7" in rank0[True]
    assert any("gradient checkpointing keeps each layer's input only" in line for line in lines)


def test_a_single_bf16_trainer_is_planned_as_it_trains(seven_b):
    """-t 1 --precision bf16 (the single plugin) autocasts: fp32 weights plus their bf16 copies, fp32 gradients."""
    lines, _ = dry_run(config_of([*seven_b, "-t", "1", "-i", "1", "--precision", "bf16"]), "1x8x80")
    assert any("trainer group: single" in line and "bf16" in line for line in lines)
    rank0 = next(line for line in lines if line.startswith("trainer rank 0 "))
    assert "weights 42.6, gradients 28.4, optimizer 56.7" in rank0  # 6, 4 and 8 bytes x 7.62B parameters


def test_the_generation_line_sets_a_rounds_prompt_tokens_against_the_engines_step(seven_b):
    """-ibs 8 x -g 8 x -mpt 300 = 19,200 prompt tokens; vLLM on a CPU takes max(4,096, -mpt + -mnt) a step."""
    flags = [*seven_b, "-ibs", "8", "-g", "8", "-mpt", "300", "-mnt", "256"]
    line = lambda lines: next(text for text in lines if text.startswith("generation: "))  # noqa: E731
    lines, _ = dry_run(config_of([*flags, "-b", "vllm"]), "1x0x24x2")
    assert line(lines) == ("generation: a round prefills up to 19,200 prompt tokens per generator (8 prompts (-ibs) x "
                           "8 samples (-g) x -mpt 300); vllm takes 4,096 a step, never splitting a prompt (so seeded "
                           "samples repeat): at least 5 prefill step(s)")
    lines, _ = dry_run(config_of([*flags, "-b", "vllm", "-mpt", "4000", "-mnt", "1024"]), "1x0x24x2")
    assert "vllm takes 5,024 a step" in line(lines) and "at least 51 prefill step(s)" in line(lines)
    lines, _ = dry_run(config_of([*flags, "-b", "transformers", "-imbs", "4"]), "1x0x24x2")
    assert line(lines).endswith("transformers prefills each call of -imbs 4 samples whole")


def test_the_plan_says_the_layout_the_rule_chooses(seven_b):
    """The micro-batch layout in one line, by the same rule as the trainer's start (coati/layouts/rule.py): shared
    prompts for a 7B model on the single-process plugin, the model's check named; padded rows without them; the
    pipelines' rows under -pp."""
    line = lambda lines: next(text for text in lines if text.startswith("trainer micro-batches: "))  # noqa: E731
    single = [*seven_b, "-t", "1", "-i", "1", "-g", "8"]
    lines, _ = dry_run(config_of(single), "1x8x80")
    assert "each group's prompt run once for its samples" in line(lines)
    assert line(lines).endswith("the model is checked as training starts (else the next cheapest where it does not "
                                "give the padded step's numbers so)")
    lines, _ = dry_run(config_of([*single, "--shared-prompts", "off"]), "1x8x80")
    assert line(lines).startswith("trainer micro-batches: at most ") and "padded tokens each" in line(lines)
    lines, _ = dry_run(config_of([*seven_b, *SEED_LAYOUT]), "4x8x80")
    assert line(lines) == "trainer micro-batches: 2 rows each (-tmbs per pipeline stage)"
