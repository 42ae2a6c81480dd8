"""Mixed precision for the torch plugins: fp32 master weights and optimizer states, bf16 compute.

- single, torch-ddp, torch-tp (dp 1), torch-pp and colossalai-ddp keep the model in fp32 and run its forward
  under ``torch.autocast(device, bfloat16)``: matmuls and their saved activations are bf16, the parameters, their
  gradients and AdamW's states stay fp32 (autocast casts a weight once per forward and frees the copy after).
- torch-fsdp2 (and torch-tp over dp > 1, which is FSDP2-sharded) uses FSDP2's ``MixedPrecisionPolicy``: the
  gathered parameters are bf16 for compute, gradients are reduced and kept in fp32 on the fp32 shards.

fp16 needs a loss scaler, which these plugins do not have: ``validation.validate_layout`` refuses it for them.
Losses take the bf16 logits and compute log-softmax in fp32 (``coati.algorithm.batch.token_logprobs``).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str):
    """The context a forward runs in: autocast to the compute dtype, or nothing in fp32."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=COMPUTE_DTYPES[precision])


def fsdp_policy(precision: str):
    """FSDP2's policy: parameters gathered in the compute dtype, gradients reduced in fp32; None in fp32."""
    if precision == "fp32":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[precision], reduce_dtype=torch.float32)
