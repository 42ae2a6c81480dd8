"""LoRA through a multi-rank plugin: the checks of ``tests/models/test_lora.py`` on a trainer group.

``python -m tests.plugins.lora_check --layouts torch-ddp,colossalai-ddp --out DIR`` run by every rank of a
trainer group (as ``tests.plugins.equivalence``) puts the same adapters (``coati.models.lora.add_adapters``,
rank 4) on the tiny Qwen2 under each layout and, on rank 0, writes ``DIR/<layout>.pt`` with:

- ``init_diff``: the plugin's forward at setup against the base model's (the adapters start as the base);
- ``optimised``: names of the parameters the optimizer updates (for ZeRO its working parameters, whose fp32
  masters it partitions), ``master_dtypes`` / ``master_numel`` of what it keeps on this rank, ``with_grad``
  (parameters holding a gradient after a backward, where the layout leaves gradients on them);
- ``grad_norms``: the two steps' gradient norms (batches A, B); ``version``: ``named_full_tensors()`` after them;
  ``frozen_moved``: how far the frozen base of ``named_full_tensors(include_frozen=True)`` moved from the start;
- ``off_diff`` / ``on_diff``: forwards inside ``adapters_off()`` against the base, and outside it;
  ``logprobs``: the plugin's forward after the steps; ``merged_diff``: the plain model loaded with
  ``merged_tensors`` against the plugin's forward;
  ``saved_diff``: the ``save_pretrained`` directory (a PEFT one, loaded by peft) against the plugin's forward;
- ``state_files``: what a ColossalAI trainer state keeps of the model (its ``model/`` directory);
- ``resumed_diff``: a fresh plugin with other adapters that loads the state saved after step 1 and trains step
  2 (batch B), against the uninterrupted run's version.
"""

from __future__ import annotations

import argparse
import os

import torch

from coati.config.lora import LoraConfig
from tests.plugins.equivalence import (grpo_batch, init_group, make_layout_plugin, rank_micro_batches,
                                       run_rank_and_exit, tiny_model, train_step)

LORA = LoraConfig(lora_rank=4, lora_alpha=8.0)
LR = 1e-2  # large enough that two steps move the adapters well past the tolerances


def _adapted_plugin(layout: str, scramble: bool = False):
    from coati.models.lora import add_adapters, version_parameters

    model = add_adapters(tiny_model()[0], LORA)
    if scramble:  # adapters unlike the saved ones: a resume must replace them
        with torch.no_grad():
            for _, param in version_parameters(model):
                param.normal_(std=0.1)
    plugin = make_layout_plugin(layout)
    plugin.setup(model, LR)
    return plugin


def _logprobs(plugin, micro_batches) -> torch.Tensor:
    from coati.algorithm.batch import token_logprobs

    return torch.cat(plugin.forward_only(micro_batches, lambda logits, m: token_logprobs(logits.float(),
                                                                                          m["input_ids"]).cpu()))


def _model_logprobs(model, micro_batches) -> torch.Tensor:
    from coati.algorithm.batch import token_logprobs

    with torch.no_grad():
        return torch.cat([token_logprobs(model(input_ids=m["input_ids"], attention_mask=m["attention_mask"]).logits,
                                         m["input_ids"]) for m in micro_batches])


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _optimised(plugin) -> tuple[list[str], list[str], int]:
    """Names of the parameters the optimizer updates; dtypes and element count of what it keeps on this rank."""
    optimizer = plugin.optimizer
    inner = getattr(optimizer, "optim", optimizer)
    working = getattr(optimizer, "_working_param_groups", None)  # LowLevelZero: masters stand in for them
    groups = working.values() if working else [group["params"] for group in inner.param_groups]
    params = [p for group in groups for p in group]
    names = {id(p): n for n, p in plugin.module.named_parameters()}
    masters = [p for group in inner.param_groups for p in group["params"]]
    return (sorted(names[id(p)] for p in params), sorted({str(p.dtype) for p in masters}),
            sum(p.numel() for p in masters))


def check_layout(layout: str, out: str) -> dict:
    from coati.cluster.weight_sync import load_named_tensors
    from coati.models.lora import is_adapter_dir, merged_tensors

    base, tokenizer = tiny_model()
    batches = [grpo_batch(base.config.vocab_size, tokenizer.pad_token_id, seed=seed) for seed in (0, 1)]
    plugin = _adapted_plugin(layout)
    probe = rank_micro_batches(batches[0], plugin, 2)
    base_logprobs = _model_logprobs(base, probe)
    result = {"init_diff": _diff(_logprobs(plugin, probe), base_logprobs)}
    result["optimised"], result["master_dtypes"], result["master_numel"] = _optimised(plugin)
    initial = dict(plugin.named_full_tensors(include_frozen=True))

    norms = [train_step(plugin, batches[0])[1]]
    state = os.path.join(out, "state", layout.replace(":", "_"))
    plugin.save_state(state)
    model_state = os.path.join(state, "model")  # ColossalAI's layout of a trainer state (DCP has none)
    result["state_files"] = sorted(os.listdir(model_state)) if os.path.isdir(model_state) else []
    norms.append(train_step(plugin, batches[1])[1])
    result["grad_norms"] = norms
    result["version"] = dict(plugin.named_full_tensors())
    full = dict(plugin.named_full_tensors(include_frozen=True))
    frozen = [name for name in full if name not in result["version"]]
    result["frozen_moved"] = max(_diff(full[n], initial[n]) for n in frozen) if full else 0.0

    trained = result["logprobs"] = _logprobs(plugin, probe)
    with plugin.adapters_off():
        result["off_diff"] = _diff(_logprobs(plugin, probe), base_logprobs)
    result["on_diff"] = _diff(trained, base_logprobs)
    if full:
        load_named_tensors(base, merged_tensors(full.items(), LORA))
        result["merged_diff"] = _diff(_model_logprobs(base.float(), probe), trained)
    path = os.path.join(out, "adapter", layout.replace(":", "_"))
    plugin.save_pretrained(path)
    if plugin.is_weight_sender:
        assert is_adapter_dir(path), os.listdir(path)
        from peft import PeftModel

        result["saved_diff"] = _diff(_model_logprobs(PeftModel.from_pretrained(tiny_model()[0], path), probe), trained)
    plugin.forward_backward(probe, lambda logits, m: (logits.float().mean(), {}))
    result["with_grad"] = sorted(n for n, p in plugin.module.named_parameters() if p.grad is not None)
    plugin.close()

    again = resume(layout, layout, out)
    if again:
        result["resumed_diff"] = max(_diff(again[n], t) for n, t in result["version"].items())
    return result


def resume(layout: str, source: str, out: str) -> dict[str, torch.Tensor]:
    """Step 2 of ``layout`` from ``source``'s state after step 1, on a fresh plugin whose adapters differ; the
    version after it (on the sender)."""
    base, tokenizer = tiny_model()
    second = grpo_batch(base.config.vocab_size, tokenizer.pad_token_id, seed=1)
    plugin = _adapted_plugin(layout, scramble=True)
    plugin.load_state(os.path.join(out, "state", source.replace(":", "_")))
    train_step(plugin, second)
    version = dict(plugin.named_full_tensors())
    plugin.close()
    return version


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layouts", required=True, help="comma-separated layouts, run in order")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cross", default="", help="comma-separated LAYOUT@SOURCE: resume LAYOUT from the state "
                                                    "SOURCE saved after step 1 (after --layouts), write its version "
                                                    "to DIR/cross_LAYOUT@SOURCE.pt")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    def work() -> None:
        layouts = args.layouts.split(",")
        init_group(layouts, rank, world_size)
        for layout in layouts:
            result = check_layout(layout, args.out)
            if rank == 0:
                torch.save(result, os.path.join(args.out, layout.replace(":", "_") + ".pt"))
                print(f"[rank0] {layout}: " + " ".join(f"{k} {v:.2e}" for k, v in result.items()
                                                       if isinstance(v, float)), flush=True)
        for case in args.cross.split(",") if args.cross else []:
            layout, source = case.split("@")
            version = resume(layout, source, args.out)
            if rank == 0:
                torch.save(version, os.path.join(args.out, f"cross_{case.replace(':', '_')}.pt"))

    run_rank_and_exit(work)


if __name__ == "__main__":
    main()
