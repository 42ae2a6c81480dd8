"""A trainer rank's measured peak against `--dry-run`'s estimate (coati/cluster/memory.py), on the CPU.

The single-process plugin trains a Qwen2 (vocabulary 32768, hidden 256, 4 layers, tied embeddings) on one
micro-batch of 4 x 128 tokens with the GRPO objective's tensors: the token log-probabilities in the loss and the
entropy metric beside it. Every tensor storage created during the second step (forward, backward, AdamW) is
counted while it lives, under a dispatch mode; the parameters and optimizer states that exist before it are
added. This is the number `torch.cuda.max_memory_allocated` gives on a GPU, without the allocator's rounding.
The estimate is ``trainer_memory`` for the same shape and layout, without the process's runtime (the
measurement counts tensors only).

The entropy metric works through the logits in slices of ``--entropy-slice`` of the float32 logits (default
1/25, their ratio on the Qwen2.5-0.5B-shaped run of scripts/gpu_check.sh: 64 MiB of 1.6 GiB); ``--entropy-slice 1``
takes them at once, as before the slicing.

    .venv/bin/python benchmarks/bench_trainer_memory.py [--entropy-slice 0.04]
"""

from __future__ import annotations

import argparse
import os
import sys
import weakref

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

BATCH, SEQ = 4, 128
QWEN2 = dict(vocab_size=32768, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=1024, tie_word_embeddings=True, use_cache=False)
# Gemma 3's quirks at a small width (its 262k vocabulary, sandwich norms, QK norms, one KV head, tanh GELU,
# sliding windows, tied embeddings): the logits dominate, as in Gemma 3 270M
GEMMA3 = dict(vocab_size=262144, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
              head_dim=64, intermediate_size=1024, sliding_window=64, tie_word_embeddings=True, use_cache=False)
FAMILIES = {"qwen2": ("Qwen2", QWEN2), "gemma3": ("Gemma3Text", GEMMA3)}
CASES = (("fp32", 0, False), ("bf16", 0, False), ("fp32", 0, True), ("bf16", 16, False), ("bf16", 16, True))


class LiveStorageBytes(TorchDispatchMode):
    """Bytes of the tensor storages that operations create under it and that are still alive; ``peak`` is the
    most at any moment. (torch's MemTracker hooks every parameter's gradient, which frozen LoRA bases refuse.)"""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def _freed(self, key: int, size: int) -> None:
        self.live -= size
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._seen:  # a view of an existing storage adds nothing
                    self._seen.add(key)
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._freed, key, storage.nbytes())
        return out


def measure(precision: str, lora_rank: int, checkpointing: bool, entropy_slice: float,
            family: str = "qwen2") -> tuple[float, float]:
    """(measured peak, estimated peak) in bytes for one case."""
    import transformers

    from coati.algorithm.batch import token_logprobs
    from coati.algorithm.loss import token_entropy
    from coati.cluster.memory import MemoryLayout, ModelShape, trainer_memory
    from coati.parallel.dims import ParallelDims
    from coati.config.lora import LoraConfig
    from coati.models.lora import add_adapters
    from coati.plugins import make_plugin

    torch.manual_seed(0)
    prefix, fields = FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(**fields)
    model = getattr(transformers, f"{prefix.removesuffix('Text')}ForCausalLM")(config)
    shape = ModelShape.from_config(config.to_dict())
    if lora_rank:
        model = add_adapters(model, LoraConfig(lora_rank=lora_rank))
    plugin = make_plugin("single", precision=precision)
    plugin.setup(model, 1e-4, gradient_checkpointing=checkpointing)
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    micro = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    slice_bytes = max(1, int(entropy_slice * BATCH * (SEQ - 1) * config.vocab_size * 4))

    def loss_fn(logits, batch):
        loss = -token_logprobs(logits, batch["input_ids"]).mean()
        return loss, {"entropy": token_entropy(logits, chunk_bytes=slice_bytes).mean()}

    plugin.forward_backward([micro], loss_fn)  # the first step creates AdamW's states
    plugin.optimizer_step(1.0)
    resident = sum(p.untyped_storage().nbytes() for p in plugin.model.parameters())
    resident += sum(v.untyped_storage().nbytes() for state in plugin.optimizer.state.values()
                    for v in state.values() if torch.is_tensor(v) and v.dim())
    with LiveStorageBytes() as live:
        plugin.forward_backward([micro], loss_fn)
        plugin.optimizer_step(1.0)
    layout = MemoryLayout(ParallelDims(precision=precision), "torch", checkpointing=checkpointing,
                          adapter_params=shape.adapter_params(lora_rank) if lora_rank else 0)
    return resident + live.peak, trainer_memory(shape, layout, BATCH, SEQ, on_cpu=False)["total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entropy-slice", type=float, default=0.04,
                        help="the entropy metric's slice, as a fraction of the float32 logits (1: all at once)")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen2",
                        help="the model's family and shape (gemma3: a 262k vocabulary; the logits dominate)")
    args = parser.parse_args()
    if not 0 < args.entropy_slice <= 1:
        parser.error(f"--entropy-slice {args.entropy_slice:g}: a fraction of the logits, in (0, 1]")
    torch.set_num_threads(1)
    name, fields = FAMILIES[args.family]
    logits_mib = BATCH * (SEQ - 1) * fields["vocab_size"] * 4 / 2**20
    print(f"{name} vocab {fields['vocab_size']}, hidden {fields['hidden_size']}, {fields['num_hidden_layers']} layers; "
          f"{BATCH} x {SEQ} tokens (float32 logits {logits_mib:.0f} MiB); entropy slice {args.entropy_slice:g}")
    print("| precision | LoRA rank | checkpointing | measured MiB | estimate MiB | estimate / measured |")
    print("|---|---|---|---|---|---|")
    for precision, rank, checkpointing in CASES:
        measured, estimate = measure(precision, rank, checkpointing, args.entropy_slice, args.family)
        print(f"| {precision} | {rank or '-'} | {'on' if checkpointing else 'off'} | {measured / 2**20:.1f} | "
              f"{estimate / 2**20:.1f} | {estimate / measured:.2f} |")


if __name__ == "__main__":
    main()
