"""Save / resume checks of the plugins' trainer-state checkpoints (``save_state`` / ``load_state``).

``python -m tests.plugins.state_check --cases CASES --out DIR`` run by every rank of a trainer group (as
``tests.plugins.equivalence``; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment) runs, in order,
comma-separated cases on the tiny Qwen2 (fp32, AdamW lr 1e-4, clipping at 1.0):

- ``save:LAYOUT``: step 1 (batch A), ``save_state(DIR/ckpt/LAYOUT)``, step 2 (batch B); rank 0 writes
  ``DIR/save_LAYOUT.pt`` (step-1 weights, step-2 loss and weights): the uninterrupted run.
- ``load:LAYOUT@SOURCE``: build LAYOUT from the initial model, ``load_state(DIR/ckpt/SOURCE)``, step 2
  (batch B); rank 0 writes ``DIR/load_LAYOUT@SOURCE.pt`` (weights right after loading, step-2 loss and weights).
- ``refuse:LAYOUT@SOURCE``: ``load_state`` must raise ``ValueError``; rank 0 writes its message.

Run the ``load`` cases in a new set of processes (a fresh process group), after the ``save`` ones.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from tests.plugins.equivalence import (full_weights, grpo_batch, init_group, make_layout_plugin, run_rank_and_exit,
                                       tiny_model, train_step)

LR = 1e-4


def file_name(layout: str) -> str:
    return layout.replace(":", "_")


def _fresh_plugin(layout: str):
    model, tokenizer = tiny_model()
    plugin = make_layout_plugin(layout)
    plugin.setup(model, LR)
    batches = [grpo_batch(model.config.vocab_size, tokenizer.pad_token_id, seed=seed) for seed in (0, 1)]
    return plugin, batches


def save_case(layout: str, out: str) -> dict:
    plugin, (first, second) = _fresh_plugin(layout)
    train_step(plugin, first)
    step1_weights = full_weights(plugin)
    start = time.perf_counter()
    plugin.save_state(os.path.join(out, "ckpt", file_name(layout)))
    save_s = time.perf_counter() - start
    loss, grad_norm, _ = train_step(plugin, second)
    result = {"step1_weights": step1_weights, "loss": loss, "grad_norm": grad_norm, "weights": full_weights(plugin),
              "save_s": save_s}
    plugin.close()
    return result


def load_case(layout: str, source: str, out: str, refuse: bool = False) -> dict:
    plugin, (_, second) = _fresh_plugin(layout)
    start = time.perf_counter()
    try:
        plugin.load_state(os.path.join(out, "ckpt", file_name(source)))
    except ValueError as error:
        if not refuse:
            raise
        plugin.close()
        return {"error": str(error)}
    if refuse:
        raise AssertionError(f"{layout} loaded the checkpoint of {source}; expected a ValueError")
    load_s = time.perf_counter() - start
    loaded_weights = full_weights(plugin)
    loss, grad_norm, _ = train_step(plugin, second)
    result = {"loaded_weights": loaded_weights, "loss": loss, "grad_norm": grad_norm, "weights": full_weights(plugin),
              "load_s": load_s}
    plugin.close()
    return result


def run_case(case: str, out: str) -> tuple[str, dict]:
    kind, spec = case.split(":", 1)
    if kind == "save":
        return f"save_{file_name(spec)}", save_case(spec, out)
    layout, source = spec.split("@")
    if kind not in ("load", "refuse"):
        raise ValueError(f"unknown case {case!r}: use save:LAYOUT, load:LAYOUT@SOURCE or refuse:LAYOUT@SOURCE")
    return f"{kind}_{file_name(layout)}@{file_name(source)}", load_case(layout, source, out, refuse=kind == "refuse")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", required=True, help="comma-separated cases, run in order")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    def work() -> None:
        cases = args.cases.split(",")
        init_group([case.split(":", 1)[1].split("@")[0] for case in cases], rank, world_size)
        for case in cases:
            start = time.perf_counter()
            name, result = run_case(case, args.out)
            if rank == 0:
                torch.save(result, os.path.join(args.out, name + ".pt"))
                print(f"[rank0] {case}: {time.perf_counter() - start:.1f}s "
                      + (f"loss {result['loss']:.8f}" if "loss" in result else f"refused: {result['error']}"),
                      flush=True)

    run_rank_and_exit(work)


if __name__ == "__main__":
    main()
