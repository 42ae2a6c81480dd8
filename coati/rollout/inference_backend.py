"""The inference side of the system: prompts in, G sampled completions with behaviour logprobs out.

``InferenceBackend`` is the protocol every engine implements (transformers here; vLLM in its own module).
Behaviour logprobs are ``log_softmax(logits / temperature)`` of the sampled token, which is exactly what
the trainer recomputes, so the importance ratio starts at 1 (top-k/top-p only choose which tokens can be
sampled; they do not enter the logprob, as in the trainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import torch

from coati.cluster.weight_sync import load_named_tensors
from coati.config.sampling import SamplingParams


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # one per token in token_ids
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (hit max_new_tokens)
    text: str = ""


class InferenceBackend(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """For each prompt (token ids), ``params.n`` completions."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the policy weights in place (full, unsharded tensors keyed by HF parameter names)."""


def truncate_completion(tokens: list[int], eos_id: int, stop_strings: tuple[str, ...], decode) -> tuple[int, str]:
    """Length to keep and the finish reason: cut after the first EOS, else at the end of the first stop string.

    Cutting afterwards yields the same tokens as stopping early would have: sampling is autoregressive.
    """
    if eos_id in tokens:
        return tokens.index(eos_id) + 1, "stop"
    if stop_strings and any(s in decode(tokens) for s in stop_strings):
        for end in range(1, len(tokens) + 1):
            if any(s in decode(tokens[:end]) for s in stop_strings):
                return end, "stop"
    return len(tokens), "length"


class TransformersBackend:
    """Sampling with ``transformers``' ``generate``: the CPU fallback and the reference engine."""

    def __init__(self, model, tokenizer, prompts_per_call: int = 64):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.prompts_per_call = prompts_per_call  # -imbs: a call samples all n completions of each of its prompts
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id

    @classmethod
    def from_pretrained(cls, model_path: str, prompts_per_call: int = 64, placement=None, adapters=None):
        """``placement``: a ``coati.utils.device.ModelPlacement`` (where the caller's role puts the model; the
        CPU in float32 when not given). ``adapters``: the run's LoRA settings (``RLConfig.engine_adapters``) when
        weight versions are adapter tensors: the engine carries the same adapters and loads those alone."""
        from transformers import AutoTokenizer

        from coati.models.families import load_causal_lm

        dtype, device = (torch.float32, "cpu") if placement is None else (placement.dtype, placement.device)
        model = load_causal_lm(model_path, dtype=dtype)
        if adapters is not None:
            from coati.models.lora import add_adapters

            model = add_adapters(model, adapters)
        return cls(model.to(device), AutoTokenizer.from_pretrained(model_path), prompts_per_call)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        if params.seed is not None:  # generate() samples from the global torch RNG
            torch.manual_seed(params.seed)
        groups: list[list[Completion]] = []
        # whole prompts per call (-imbs), as every engine and the async rounds count them: one call of many rows
        # costs about what one of few does for a small model, whose steps are Python's time, not the matmuls'
        for start in range(0, len(prompts), self.prompts_per_call):
            chunk = prompts[start : start + self.prompts_per_call]
            completions = self._generate_batch([p for p in chunk for _ in range(params.n)], params)
            groups.extend(completions[i * params.n : (i + 1) * params.n] for i in range(len(chunk)))
        return groups

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        sampling = {} if params.greedy else dict(
            temperature=params.temperature, top_k=params.top_k if params.top_k > 0 else None, top_p=params.top_p
        )
        device = self.model.device
        recorder = StepLogprobs(params.logprob_temperature)
        hook = _generating_model(self.model).register_forward_hook(recorder.hook, with_kwargs=True)
        try:
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                do_sample=not params.greedy,
                max_new_tokens=params.max_new_tokens,
                return_dict_in_generate=True,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_id,
                **sampling,
            )
        finally:
            hook.remove()
        new_tokens = out.sequences[:, width:].cpu()
        logprobs = recorder.finish(new_tokens)
        results = []
        for row in range(len(prompts)):
            tokens = new_tokens[row].tolist()
            keep, reason = truncate_completion(tokens, self.eos_id, params.stop_strings, self._decode)
            tokens = tokens[:keep]
            results.append(Completion(tokens, logprobs[row, :keep].tolist(), reason, self._decode(tokens)))
        return results

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A weight version in place: the full weights, or into a model with adapters the adapter tensors."""
        from coati.models.lora import version_parameters

        load_named_tensors(self.model, named_tensors, dict(version_parameters(self.model)))


class StepLogprobs:
    """The behaviour logprob of each sampled token, read from the model's own logits during ``generate`` one step
    at a time: a forward hook keeps the last step's ``log_softmax(logits / T)`` until the next forward shows which
    token was sampled from it (its input). Memory is one step's [rows, vocab], where ``output_logits`` kept every
    step's (a 262k vocabulary x 64 rows x 256 steps: 17 GB)."""

    def __init__(self, temperature: float):
        self.temperature, self.pending, self.taken = temperature, None, []

    def hook(self, module, args, kwargs, output) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if self.pending is not None:
            self.taken.append(self._gather(input_ids[:, -1]))
        self.pending = torch.log_softmax(output.logits[:, -1, :].float() / self.temperature, dim=-1)

    def _gather(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.pending.gather(-1, tokens.to(self.pending.device).unsqueeze(-1)).squeeze(-1).cpu()

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[rows, steps] logprobs of ``new_tokens`` (the last step's read from the sequences themselves)."""
        if self.pending is not None and len(self.taken) < new_tokens.shape[1]:
            self.taken.append(self._gather(new_tokens[:, len(self.taken)]))
        self.pending = None
        return torch.stack(self.taken, dim=1) if self.taken else torch.zeros(new_tokens.shape)


def _generating_model(model):
    """The module whose forward ``generate`` calls (peft's wrappers hand generation to the model inside)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def build_transformers_backend(config, rank: int, placement) -> TransformersBackend:
    """A producer's (or the evaluator's) engine for this run, -imbs prompts per generate call."""
    return TransformersBackend.from_pretrained(config.model.path, config.batch.inference_microbatch_size, placement,
                                               config.engine_adapters)
