"""How many prompts and samples move at each step: per inferencer round, per optimizer step, per pass."""

from __future__ import annotations

from dataclasses import dataclass

from coati.utils.dataclass_cli import option


@dataclass(frozen=True)
class BatchConfig:
    num_generations: int = option(8, "completions per prompt (G)", "-g")
    inference_batch_size: int = option(64, "prompts per inferencer round; default: 64 (16 for the code demo, 32 for "
                                           "the tool demo)", "-ibs", resolved=True)
    inference_microbatch_size: int = option(64, "prompts per generate call; default: 64 (16 for the code demo, 32 "
                                                "for the tool demo)", "-imbs", resolved=True)
    train_batch_size: int = option(32, "prompts per optimizer step per data-parallel rank; default: 32 (8 for the "
                                       "code demo)", "-tbs", resolved=True)
    train_minibatch_size: int = option(32, "prompts pulled from the buffer at a time; default: 32 (8 for the code "
                                           "demo)", "-tMbs", resolved=True)
    train_microbatch_size: int = option(256, "samples per forward/backward pass; default: 256 (64 for the code demo)",
                                        "-tmbs", resolved=True)
    train_microbatch_tokens: int = option(0, "padded tokens per forward/backward pass: rows longest first, as many as "
                                             "fit with their longest row; default: -tmbs x (-mpt + -mnt), the "
                                             "micro-batch the memory plan sized", "-tmbt")
    packing: str = option("auto", "-tmbt micro-batches run their samples packed into one row without padding "
                                  "(position ids restarting, attention kept within each sample): auto: where the "
                                  "plugin runs the model's own forward, the model keeps packed samples apart (checked "
                                  "before training) and the layout rule finds it the fastest (coati/layouts/rule.py: "
                                  "under FlashAttention); on: packed, refused where it cannot; off: never",
                            choices=("auto", "on", "off"))
    shared_prompts: str = option("auto", "a group's samples run its prompt through the trainer once, not once per "
                                         "sample (the responses on the prompt's KV cache, whole groups a micro-batch; "
                                         "-tmbt counts both passes' tokens): auto (the default): where the plugin "
                                         "allows it (the single-process plugin, without --gradient-checkpointing), "
                                         "the model gives the padded logits (checked before training) and the layout "
                                         "rule finds it the fastest (groups of several samples, a model whose forward "
                                         "pass is not all overhead); on: refused elsewhere; off: never",
                                 choices=("auto", "on", "off"))
    round_minibatches: bool = option(True, "each optimizer step of a round trains on a random part of the round's "
                                           "samples (advantages over whole groups first; rounds of several steps "
                                           "only); --no-round-minibatches: whole groups per step, in draw order")
