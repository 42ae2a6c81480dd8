"""One GRPO step under any plugin layout, for checking that layouts agree (tests, benchmarks, bring-up).

``python -m tests.plugins.equivalence --layouts single,torch-ddp --out DIR`` run by every rank of a trainer
group (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment) trains one optimizer step per layout
on the same tiny Qwen2 and the same batch, and rank 0 writes ``DIR/<layout>.pt`` with the step's loss,
gradient norm and full weights after the step. The process ends with ``os._exit`` (ColossalAI runs
sometimes hang in interpreter shutdown).

Layout names: a plugin name with options, e.g. ``colossalai-hybrid:tp=2``, ``torch-fsdp2:zero=3``,
``colossalai-zero:zero=2:precision=bf16``, ``torch-pp:pp=2:arch=llama`` (tiny Llama instead of Qwen2),
``torch-ddp:gc=1`` (gradient checkpointing). Each result also records the dtypes the model's linear layers
computed in on rank 0 (``forward_dtypes``) and the dtypes of the parameters the optimizer updates
(``master_dtypes``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback

import torch

from coati.algorithm.loss import PolicyLossConfig, batch_normaliser
from coati.algorithm.policy_losses import LossInputs, policy_loss
from coati.algorithm.batch import collate, split_micro_batches, token_logprobs
from coati.rollout.group import RolloutGroup

LOSS_CONFIG = PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.28, loss_variation="token_level")


def tiny_model(arch: str = "qwen2", seed: int = 1, num_layers: int = 2):
    """The tiny Qwen2 or Llama of coati.models.tiny; another ``arch`` names a family of coati.models.families (its
    tiny model, loaded with the trainer's attention implementation)."""
    from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model

    if arch not in ("qwen2", "llama"):
        from coati.models.families import build_family_model, tiny_tokenizer, trainer_attention

        tokenizer = tiny_tokenizer(arch)
        model = build_family_model(arch, tokenizer, seed=seed)
        if trainer_attention(model.config):
            model.set_attn_implementation(trainer_attention(model.config))
        return model, tokenizer
    tokenizer = build_char_tokenizer()
    return build_tiny_model(TinyModelSpec(arch=arch, num_layers=num_layers), tokenizer, seed=seed), tokenizer


def grpo_groups(vocab_size: int, pad_id: int, num_groups: int = 2, group_size: int = 4, seed: int = 0):
    """Deterministic rollout groups with varied lengths, non-trivial old logprobs and group advantages."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(num_groups):
        prompt = torch.randint(3, vocab_size, (int(torch.randint(4, 9, (1,), generator=gen)),), generator=gen).tolist()
        responses, logprobs = [], []
        for _ in range(group_size):
            length = int(torch.randint(3, 13, (1,), generator=gen))
            responses.append(torch.randint(3, vocab_size, (length,), generator=gen).tolist())
            # around the logprob of a uniform guess, so ratios land on both sides of the clip range
            logprobs.append((-math.log(vocab_size) + 0.4 * torch.randn(length, generator=gen)).tolist())
        rewards = torch.rand(group_size, generator=gen)
        groups.append(RolloutGroup(prompt_ids=prompt, responses=responses, logprobs=logprobs,
                                   rewards=rewards.tolist(), correct=[False] * group_size,
                                   format_ok=[True] * group_size, finish_reasons=["stop"] * group_size,
                                   policy_version=0))
    return groups


def grpo_batch(vocab_size: int, pad_id: int, **kwargs) -> dict[str, torch.Tensor]:
    groups = grpo_groups(vocab_size, pad_id, **kwargs)
    batch = collate(groups, pad_id)
    rewards = torch.tensor([g.rewards for g in groups])
    batch["advantages"] = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(-1)
    batch["action_mask"][-1] = 0.0  # one sample entirely masked out (e.g. a filtered truncated response)
    return batch


def rank_micro_batches(batch, plugin, micro_batch_size: int):
    """This data-parallel rank's contiguous slice of the batch, with the data-parallel normaliser
    (``coati.plugins.dist.data_parallel_normaliser``: the global one / dp_size). Collective."""
    from coati.plugins.dist import data_parallel_normaliser

    total = batch["input_ids"].shape[0]
    dp_rank, dp_size = plugin.dp_rank, plugin.dp_size
    if total % dp_size:
        raise ValueError(f"batch of {total} does not split over {dp_size} data-parallel ranks")
    share = total // dp_size
    mine = {k: v[dp_rank * share : (dp_rank + 1) * share] for k, v in batch.items()}
    local = batch_normaliser(mine["action_mask"], LOSS_CONFIG.loss_variation)
    mine["normaliser"] = torch.full((share,), data_parallel_normaliser(local, plugin))
    return split_micro_batches(mine, micro_batch_size)


def grpo_loss_fn(logits, micro_batch):
    logprobs = token_logprobs(logits, micro_batch["input_ids"])
    return policy_loss(LossInputs(logprobs, micro_batch["old_logprobs"], micro_batch["advantages"],
                                  micro_batch["action_mask"], float(micro_batch["normaliser"][0])), LOSS_CONFIG)


def parse_layout(text: str) -> tuple[str, dict]:
    name, *options = text.split(":")
    values = {}
    for option in options:
        key, value = option.split("=")
        values[key] = value if key in ("precision", "arch") else int(value)
    return name, values


def make_layout_plugin(text: str):
    from coati.plugins import make_plugin

    name, options = parse_layout(text)
    return make_plugin(name, tp_size=options.get("tp", 1), pp_size=options.get("pp", 1),
                       zero_stage=options.get("zero", 0), precision=options.get("precision", "fp32"))


def train_step(plugin, batch, micro_batch_size: int = 2, max_grad_norm: float = 1.0, loss_fn=grpo_loss_fn):
    """One optimizer step of ``plugin`` on this data-parallel rank's share of ``batch``; (loss of the whole
    batch, gradient norm, this rank's statistics). Collective."""
    import torch.distributed as dist

    stats = plugin.forward_backward(rank_micro_batches(batch, plugin, micro_batch_size), loss_fn)
    grad_norm = plugin.optimizer_step(max_grad_norm)
    loss = torch.tensor(sum(float(s["loss"]) for s in stats), dtype=torch.float64)
    if plugin.world_size > 1:
        # a dp rank's loss is dp_size x its share (normaliser / dp_size); model-parallel peers hold the same
        # value, so the mean over all ranks is the loss of the whole batch
        dist.all_reduce(loss)
        loss /= plugin.world_size
    return float(loss), grad_norm, stats


def full_weights(plugin) -> dict[str, torch.Tensor]:
    """Full fp32 copies of the weights on the sender (empty elsewhere). Collective."""
    return {name: tensor.float().clone() for name, tensor in plugin.named_full_tensors()}


def init_group(layouts: list[str], rank: int, world_size: int) -> None:
    """Join the trainer group of the environment (unless every layout is ``single`` in one process)."""
    if world_size > 1 or any(not layout.startswith("single") for layout in layouts):
        from coati.plugins.dist import init_trainer_group

        init_trainer_group(rank, world_size, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                           int(os.environ.get("MASTER_PORT", 29511)))
        if any(layout.startswith("colossalai") for layout in layouts):
            from coati.plugins.colossal import launch_colossalai

            launch_colossalai()


def record_forward_dtypes(model, seen: set | None = None) -> set:
    """The dtypes the outputs of ``model``'s linear layers (any module class named ``*Linear*``, so ColossalAI's
    sharded replacements too) come out in, filled as it runs (forward hooks, once per module)."""
    seen = set() if seen is None else seen
    for module in model.modules():
        if "Linear" in type(module).__name__ and not getattr(module, "_dtype_hook", False):
            module._dtype_hook = True
            module.register_forward_hook(lambda _module, _inputs, output: seen.add(str(output.dtype)))
    return seen


def master_dtypes(plugin) -> list[str]:
    """The dtypes of the parameters ``plugin``'s optimizer updates (for a ColossalAI wrapper: its inner one's)."""
    optimizer = getattr(plugin.optimizer, "optim", plugin.optimizer)
    return sorted({str(param.dtype) for group in optimizer.param_groups for param in group["params"]})


def run_step(layout: str, lr: float = 1e-4, micro_batch_size: int = 2, max_grad_norm: float = 1.0,
             batch_kwargs: dict | None = None, save_dir: str | None = None) -> dict:
    """One optimizer step of ``layout`` in this process (a rank of the current group)."""
    options = parse_layout(layout)[1]
    model, tokenizer = tiny_model(arch=options.get("arch", "qwen2"))
    batch = grpo_batch(model.config.vocab_size, tokenizer.pad_token_id, **(batch_kwargs or {}))
    forward_dtypes = record_forward_dtypes(model)
    plugin = make_layout_plugin(layout)
    plugin.setup(model, lr, gradient_checkpointing=bool(options.get("gc", 0)))
    if isinstance(getattr(plugin, "model", None), torch.nn.Module):  # layers ColossalAI's shardformer replaced
        record_forward_dtypes(plugin.model, forward_dtypes)
    seen = set()  # devices of what loss_fn is handed (this rank runs no loss_fn off a pipeline's last stage)

    def loss_fn(logits, micro_batch):
        seen.update(str(tensor.device) for tensor in (logits, *micro_batch.values()))
        return grpo_loss_fn(logits, micro_batch)

    start = time.perf_counter()
    loss, grad_norm, stats = train_step(plugin, batch, micro_batch_size, max_grad_norm, loss_fn)
    step_s = time.perf_counter() - start
    weights = full_weights(plugin)
    result = {"layout": layout, "loss": loss, "grad_norm": grad_norm, "weights": weights,
              "step_s": step_s, "world_size": plugin.world_size, "dp_size": plugin.dp_size,
              "stats_len": len(stats), "sender": plugin.is_weight_sender, "device": str(plugin.device),
              "loss_fn_devices": sorted(seen), "weight_devices": sorted({str(w.device) for w in weights.values()}),
              "forward_dtypes": sorted(forward_dtypes), "master_dtypes": master_dtypes(plugin)}
    if save_dir:  # save_pretrained (collective), then the sender reloads it with from_pretrained
        path = os.path.join(save_dir, layout.replace(":", "_"))
        plugin.save_pretrained(path)
        if plugin.is_weight_sender:
            from transformers import AutoModelForCausalLM

            reloaded = dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).named_parameters())
            result["saved_max_diff"] = max(float((reloaded[n].float() - w).abs().max()) for n, w in weights.items())
    plugin.close()
    return result


def run_rank_and_exit(work) -> None:
    """Run this rank's ``work()``, then leave through ``os._exit`` (ColossalAI runs sometimes hang in interpreter
    shutdown): 0 once every rank is done (rank 0 hosts the group's store, so it stays until the others are through
    with it), 1 after printing a failure, without waiting for peers."""
    code = 0
    try:
        work()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
    except BaseException:  # noqa: BLE001 - report, then leave without waiting for peers
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layouts", required=True, help="comma-separated layouts, run in order")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save-layouts", default="",
                        help="comma-separated layouts that also save_pretrained their weights and reload them")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    def work():
        layouts = args.layouts.split(",")
        init_group(layouts, rank, world_size)
        saved = set(args.save_layouts.split(",")) - {""}
        for layout in layouts:
            result = run_step(layout, save_dir=args.out if layout in saved else None)
            if rank == 0:
                torch.save(result, os.path.join(args.out, layout.replace(":", "_") + ".pt"))
                print(f"[rank0] {layout}: loss {result['loss']:.8f} grad_norm {result['grad_norm']:.6f} "
                      f"step {result['step_s']:.3f}s", flush=True)

    run_rank_and_exit(work)


if __name__ == "__main__":
    main()
