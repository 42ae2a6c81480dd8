"""The memory arithmetic of --dry-run (coati/cluster/memory.py) against numbers computed by hand."""

import pytest

from coati.cluster.memory import (
    GiB,
    ModelShape,
    MemoryLayout,
    activation_bytes,
    inferencer_memory,
    kv_bytes_per_token,
    publish_bytes,
    trainer_states,
)
from coati.parallel.dims import ParallelDims

QWEN05 = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
          "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864, "tie_word_embeddings": True}
QWEN7 = {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28,
         "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "tie_word_embeddings": False}


def test_parameter_counts_are_the_published_ones():
    assert ModelShape.from_config(QWEN05).params == 494_032_768  # Qwen2.5-0.5B
    assert ModelShape.from_config(QWEN7).params == 7_615_616_512  # Qwen2.5-7B
    llama = dict(QWEN05, model_type="llama")  # no q/k/v bias: 24 x (896 + 2 x 128) fewer
    assert ModelShape.from_config(llama).params == 494_032_768 - 24 * 1152


def test_trainer_states_by_layout():
    shape = ModelShape.from_config(QWEN05)
    P = shape.params
    assert trainer_states(shape, MemoryLayout()) == {"weights": 4 * P, "gradients": 4 * P, "optimizer": 8 * P}
    # FSDP2 over 2 ranks: shards, plus the full parameters held from forward to backward (-zero 2)
    assert trainer_states(shape, MemoryLayout(ParallelDims(2, zero_stage=2))) == {
        "weights": 2 * P + 4 * P, "gradients": 2 * P, "optimizer": 4 * P}
    # -zero 3 reshards after forward: one layer (and the prefetched one) at a time
    z3 = trainer_states(shape, MemoryLayout(ParallelDims(2, zero_stage=3)))
    assert z3["weights"] == 2 * P + 8 * shape.layer_params
    # ColossalAI HybridParallel TP 4 x PP 2 x DP 2, ZeRO-1, bf16: bf16 weights + fp32 masters / dp, fp32 grads,
    # Adam / dp, all over mp = 8
    seven = ModelShape.from_config(QWEN7)
    local = seven.params / 8
    hybrid = trainer_states(seven, MemoryLayout(ParallelDims(16, 4, 2, 1, "bf16"), "colossalai"))
    assert hybrid == {"weights": 2 * local + 2 * local, "gradients": 4 * local, "optimizer": 4 * local}
    assert hybrid["weights"] / GiB == pytest.approx(3.546, abs=1e-3)
    zero2 = trainer_states(seven, MemoryLayout(ParallelDims(16, 4, 2, 2, "bf16"), "colossalai"))
    assert zero2["gradients"] == 2 * local


def test_activations_and_logits_of_a_micro_batch():
    shape = ModelShape.from_config(QWEN05)
    out = activation_bytes(shape, MemoryLayout(), micro_batch=4, seq_len=104)
    per_token_layer = 8 * 896 + 4 * 128 + 4 * 4864  # 27136 elements
    assert out["activations"] == 4 * 416 * per_token_layer * 24 == 1_083_703_296
    assert out["logits"] == 3 * 4 * 416 * 151936 == 758_464_512


def test_inferencer_and_publish():
    shape = ModelShape.from_config(QWEN05)
    P = shape.params
    vllm = inferencer_memory(shape, "vllm", "fp32", kv_cache_bytes=0.5 * GiB, on_cpu=False)
    assert vllm == {"weights": 4 * P, "kv_cache": 0.5 * GiB, "received_weights": 0.0, "runtime": 0.0,
                    "total": 4 * P + 0.5 * GiB}
    assert kv_bytes_per_token(shape, 2) == 2 * 24 * 128 * 2
    hf = inferencer_memory(shape, "transformers", "bf16", sequences=8, seq_len=100, new_tokens=32, on_cpu=False)
    # kept logits, their scaled stack and its log-softmax: 3 fp32 copies of 8 x 32 x V
    assert hf["kv_cache"] == 12288 * 800 and hf["logits"] == 3 * 4 * 8 * 32 * 151936
    assert publish_bytes(shape, "object-store", 128) == publish_bytes(shape, "collective", 512) == 8 * P


def test_gradient_checkpointing_keeps_each_layers_input_and_one_layer():
    shape = ModelShape.from_config(QWEN05)
    out = activation_bytes(shape, MemoryLayout(checkpointing=True), micro_batch=4, seq_len=104)
    per_token_layer = 8 * 896 + 4 * 128 + 4 * 4864
    assert out["activations"] == 4 * 416 * (896 * 24 + per_token_layer) == 80_936_960  # 13x less
    assert out["logits"] == 3 * 4 * 416 * 151936  # the logits are not checkpointed


def test_torch_mixed_precision_keeps_fp32_parameters():
    """Autocast (single/DDP/TP/PP) keeps fp32 parameters and gradients beside the bf16 copies; FSDP2's mixed
    precision keeps fp32 shards and fp32 gradients, gathering bf16 full parameters."""
    shape = ModelShape.from_config(QWEN05)
    P = shape.params
    assert trainer_states(shape, MemoryLayout(ParallelDims(precision="bf16"))) == {"weights": 6 * P, "gradients": 4 * P,
                                                                      "optimizer": 8 * P}
    assert trainer_states(shape, MemoryLayout(ParallelDims(2, zero_stage=2, precision="bf16"))) == {
        "weights": 2 * P + 2 * P, "gradients": 2 * P, "optimizer": 4 * P}


def test_lora_adapters_and_their_states():
    shape = ModelShape.from_config(QWEN05)  # hidden 896, kv 2 x 64 = 128, intermediate 4864, 24 layers
    # rank 16, per block: q 16 x (896 + 896), k and v 16 x (896 + 128), o 16 x (896 + 896), gate and up
    # 16 x (896 + 4864), down 16 x (4864 + 896)
    per_block = 16 * (2 * 1792 + 2 * 1024 + 3 * 5760)
    assert shape.adapter_params(16) == 24 * per_block == 8_798_208  # what peft counts (benchmarks/bench_lora.py)
    assert shape.adapter_params(16, ("q_proj", "v_proj")) == 24 * 16 * (1792 + 1024)
    P, A = shape.params, 8_798_208
    # the frozen base in fp32, no masters; gradients and Adam for the adapters only
    assert trainer_states(shape, MemoryLayout(adapter_params=A)) == {"weights": 4 * P + 4 * A, "gradients": 4 * A,
                                                                      "optimizer": 8 * A}
    # FSDP2 x2 -zero 2: the base sharded, gathered from forward to backward
    fsdp = trainer_states(shape, MemoryLayout(ParallelDims(2, zero_stage=2), adapter_params=A))
    assert fsdp["weights"] == 2 * P + 4 * P + 4 * A
    # ColossalAI ZeRO-2 x2 in bf16: base and adapters as bf16 working weights, the adapters' fp32 masters,
    # gradients and Adam states halved over the 2 ranks
    zero = trainer_states(shape, MemoryLayout(ParallelDims(2, zero_stage=2, precision="bf16"), "colossalai",
                                              adapter_params=A))
    assert zero == {"weights": 2 * P + 2 * A + 2 * A, "gradients": 2 * A, "optimizer": 4 * A}
    assert trainer_states(shape, MemoryLayout(ParallelDims(2, zero_stage=1), "colossalai", adapter_params=A)) == \
        {"weights": 4 * P + 4 * A, "gradients": 4 * A, "optimizer": 4 * A}


def test_a_lora_version_publishes_the_adapters_alone():
    shape = ModelShape.from_config(QWEN05)
    assert publish_bytes(shape, "object-store", 128, params=8_798_208) == 8 * 8_798_208
