"""The vLLM inference backend: a real engine (CUDA ``vllm``, or ``vllm-cpu`` on a laptop) behind ``InferenceBackend``.

Behaviour logprobs. The system's definition (see inference_backend.py) is ``log_softmax(logits / T)`` of the
sampled token, with top-k/top-p only choosing which tokens may be sampled. vLLM 0.32 offers
``logprobs_mode`` = ``raw_logprobs`` (``log_softmax(logits)``, before temperature) or ``processed_logprobs``
(after temperature *and* after the top-k/top-p mask, i.e. renormalised over the kept tokens). Neither is ours
when T != 1 and top-k/top-p are on, so the engine runs in ``raw_logprobs`` mode and the temperature is folded
into the model's logits scale (``LogitsProcessor.scale = 1 / T``, set on every worker before a generate call
whose temperature differs from the last one) while vLLM samples at temperature 1: the sampling distribution
is unchanged (top-k order is scale-invariant; top-p is applied after temperature in vLLM too) and the raw
logprobs are exactly ``log_softmax(logits / T)``. Greedy runs at scale 1 with temperature 0, like
``SamplingParams.logprob_temperature``.

Weight sync. The engine is never restarted: each worker (every tensor-parallel rank) receives the full HF
named tensors and calls vLLM's ``reload_weights`` (the layerwise in-place reload, which re-runs the
post-load processing, e.g. the CPU backend's weight repacking, and lets every rank take its own shard); then
the prefix cache is reset, since cached KV blocks were computed by the old weights. How the tensors reach the
worker depends on where it lives:
  ``inproc``  engine and worker in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one rank): the tensors
              themselves, no copy before the load;
  ``shm``     otherwise, when /dev/shm has room: one file of raw bytes in /dev/shm, mapped by every rank
              (one copy in, one copy out), removed after the update;
  ``bytes``   fallback: the same bytes inside the RPC message.

Process layout on CPU. The engine runs in this process by default, except for a model vLLM serves through its
Transformers backend (no model code of its own, e.g. OLMo2): that backend decorates transformers' class in place,
and an HF model of the family in the same process (a colocated trainer's) would then fail, so that engine runs in a
child process (``runs_in_process``).

LoRA. With adapters (``--lora-rank``) the engine starts with vLLM's LoRA support (one adapter slot) and a
weight version is the adapter tensors alone: every worker builds vLLM's ``LoRAModel`` from them in memory and
puts it in the slot under one fixed adapter id, replacing the previous version (vLLM itself only loads
adapters from a directory). Requests name that id once a version has been loaded; before that the engine
runs the base, which is what the adapters start as (B = 0).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata
import importlib.util
import mmap
import os
import uuid
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from coati.config.engine import EngineOffer
from coati.config.errors import require
from coati.config.sampling import SamplingParams
from coati.rollout.inference_backend import Completion
from coati.rollout.vllm_logs import idle_layers, quiet_vllm_logs

INSTALL_HINT = ("-b vllm needs vLLM: on CPU run `bash scripts/install_vllm_cpu.sh .venv`; "
                "on a CUDA GPU `pip install -r requirements/gpu.txt` (or the project's [gpu] extra)")
WORKER_EXTENSION = "coati.rollout.vllm_backend.CoatiWorkerExtension"
_FINISH_REASONS = {"stop": "stop", "length": "length"}
ADAPTER_ID = 1  # the one adapter slot's id: every version replaces the one before under it
# vLLM sizes its adapter buffers by max_lora_rank, which must be one of these (the largest is the backend's
# max_adapter_rank in coati/registry/backends.py; higher ranks are merged into full weights instead)
_LORA_RANK_SIZES = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_available() -> bool:
    """True when ``import vllm`` can succeed (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    return torch.cuda.is_available()


# vLLM's table of the text-generation architectures it runs natively, read from its source: importing it loads
# vLLM's model code (36 s on 2 busy cores), once per run start only to ask a name.
_VLLM_REGISTRY, _VLLM_TABLE = ("model_executor", "models", "registry.py"), "_TEXT_GENERATION_MODELS"
_CPU_BUILD = "vllm-cpu"


def installed_vllm() -> str | None:
    """The distribution that provides ``vllm`` and its version ("vllm-cpu 0.32.0", "vllm 0.11.0"); None when
    vLLM is not installed."""
    if not vllm_available():
        return None
    for distribution in ("vllm", _CPU_BUILD):
        try:
            return f"{distribution} {importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm"  # importable without package metadata (a source checkout on the path)


def served_architectures(source: str) -> frozenset[str] | None:
    """The architectures named in vLLM's registry source (``source``: its text); None when the table is not
    there (a vLLM whose registry moved: the caller cannot tell)."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(target, ast.Name) and target.id == _VLLM_TABLE for target in node.targets)):
            return frozenset(key.value for key in node.value.keys
                             if isinstance(key, ast.Constant) and isinstance(key.value, str))
    return None


def vllm_offer(architectures) -> EngineOffer:
    """The registry row's offer: whether vLLM is installed here, usable on this machine's devices and serves one
    of ``architectures`` (a model's config.json), found without importing vLLM."""
    installed = installed_vllm()
    if installed is None:
        return EngineOffer(None, None)
    if installed.startswith(_CPU_BUILD + " ") and cuda_available():
        return EngineOffer(installed, None, "it runs on the CPU and this machine's models go to its GPUs")
    served = _vllm_architectures()
    return EngineOffer(installed, None if served is None else any(name in served for name in architectures))


@functools.lru_cache(maxsize=1)
def _vllm_architectures() -> frozenset[str] | None:
    found = importlib.util.find_spec("vllm").submodule_search_locations
    try:
        with open(os.path.join(list(found)[0], *_VLLM_REGISTRY)) as handle:
            return served_architectures(handle.read())
    except (OSError, SyntaxError, IndexError, TypeError):
        return None


def runs_in_process(architectures, native) -> bool:
    """Whether an engine may run in this process: vLLM serves one of ``architectures`` with its own model code
    (``native``: its table, None when unknown). Otherwise its Transformers backend runs the HF class, which it
    decorates in place for compilation: an HF model of that family in this process (the trainer's, a reference)
    then fails in its forward ("has no attribute 'do_not_compile'"), so such an engine runs in a child process."""
    return native is None or not architectures or any(name in native for name in architectures)


def model_architectures(model_path: str) -> list[str]:
    """The ``architectures`` of a local model directory's config.json ([] when there is none to read)."""
    import json

    try:
        with open(os.path.join(model_path, "config.json")) as handle:
            return list(json.load(handle).get("architectures") or [])
    except (OSError, ValueError):
        return []


def check_vllm_usable(tensor_parallel_size: int) -> None:
    """The engine's preflight: the package is importable, and -ptp > 1 has that many CUDA GPUs (vLLM's CPU
    build runs one rank). One ConfigError line otherwise."""
    require(vllm_available(), INSTALL_HINT)
    if tensor_parallel_size > 1:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        require(gpus >= tensor_parallel_size,
                f"-ptp {tensor_parallel_size} needs {tensor_parallel_size} CUDA GPUs per inferencer (vLLM tensor "
                f"parallelism); this machine has {gpus}. On CPU, vLLM runs one rank: use -ptp 1")


def build_vllm_backend(config, rank: int, placement) -> VLLMBackend:
    """A producer's (or the evaluator's) engine for this run: one seed per rank, room for the longest answer."""
    p = config.parallel
    longest = max([config.sampling.max_new_tokens, *(s.max_new_tokens for _, s in config.eval_sampling)])
    return VLLMBackend(config.model.path, VLLMEngineOptions(
        tensor_parallel_size=p.producer_tensor_parallel_size, kv_cache_gb=p.vllm_kv_cache_gb,
        gpu_memory_utilization=p.vllm_gpu_memory_utilization, seed=config.run.seed + 1000 + rank,
        max_model_len=config.data.max_prompt_tokens + longest, dtype=placement.vllm_dtype,
        sleep_mode=bool(p.colocate)), adapters=config.engine_adapters)


def lora_rank_size(rank: int) -> int:
    """The smallest adapter-buffer rank vLLM accepts that holds adapters of ``rank``."""
    return next(size for size in _LORA_RANK_SIZES if size >= rank)


def peft_adapter_config(lora) -> dict:
    """What a PEFT ``adapter_config.json`` would say of the run's adapters, as vLLM's ``PEFTHelper`` reads it."""
    targets = list(lora.targets)
    return {"r": lora.lora_rank, "lora_alpha": lora.lora_alpha, "bias": "none",
            "target_modules": targets[0] if len(targets) == 1 else targets}


def vllm_lora_name(peft_name: str) -> str:
    """peft's parameter name of an adapter tensor -> the name in an adapter file, which vLLM parses (without the
    adapter's name: ``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``)."""
    from coati.models.lora import ADAPTER

    return peft_name.replace(f".{ADAPTER}.", ".")


@dataclass(frozen=True)
class VLLMEngineOptions:
    """Engine settings that do not come from the model: parallelism, memory, seed, precision."""

    tensor_parallel_size: int = 1
    kv_cache_gb: float = 1.0  # CPU: KV-cache size per engine (several engines share one machine's memory)
    gpu_memory_utilization: float = 0.7  # GPU: fraction of the device's memory vLLM may take
    max_model_len: int | None = None  # prompt + response tokens; None: the model's own limit
    max_num_seqs: int | None = None  # sequences decoded together; None: vLLM's default (256 on CPU)
    seed: int = 0
    dtype: str = "float32"  # the trainer's precision: behaviour logprobs must match the trainer's recompute
    enforce_eager: bool | None = None  # None: eager on CPU (no graph capture to pay for), CUDA graphs on GPU
    # None: VLLM_ENABLE_V1_MULTIPROCESSING as set in the environment, else in-process on CPU (see
    # benchmarks/bench_inference_backends.py: start-up 12 s instead of 32, weight updates without a copy through
    # another process, no engine processes left behind by a killed actor) and vLLM's default (on) on GPU.
    multiprocessing: bool | None = None
    cpu_threads: int | None = None  # CPU, in-process: torch threads for the model; None: torch's current setting
    # GPU, --colocate: vLLM's sleep mode, so that the trainer gets the GPU back between generations (level 1:
    # weights to host memory, KV cache dropped; level 2 would drop the weights, and the model's buffers with them)
    sleep_mode: bool = False


class CoatiWorkerExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``); called through ``LLM.collective_rpc``."""

    def coati_load_weights(self, payload) -> int:
        tied = self._coati_tied_heads()
        # this worker's process: the reload's records are made here
        quiet_vllm_logs(tied_head=bool(tied), idle=idle_layers(self.model_runner.get_model().modules()))
        with _opened_payload(payload) as named:
            self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
            count = len(named)
            named.clear()  # drop the views before the mapping closes
        # A tied LM head shares the embedding's weight, so the reload skips it ("failed to load weights") and
        # keeps the kernel state derived from the old weight: on CPU a packed GEMM copy. Rebuild it.
        for head in tied:
            head.quant_method.process_weights_after_loading(head)
        return count

    def _coati_tied_heads(self) -> list:
        """The model's LM heads that share an embedding's weight."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        model = self.model_runner.get_model()
        embeddings = {id(m.weight) for m in model.modules()
                      if type(m) is VocabParallelEmbedding and isinstance(getattr(m, "weight", None), torch.Tensor)}
        return [module for module in model.modules()
                if isinstance(module, ParallelLMHead) and id(getattr(module, "weight", None)) in embeddings]

    def coati_load_adapter(self, payload, adapter_config: dict) -> int:
        """A new version of the one adapter, built from its tensors in memory, in place of the previous one."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        loras = self.model_runner.lora_manager
        with _opened_payload(payload) as named:  # cloned: the payload's buffer closes after the call
            tensors = {vllm_lora_name(name): tensor.clone() for name, tensor in named}
            named.clear()
        helper = PEFTHelper.from_dict(adapter_config)
        helper.validate_legal(loras.lora_config)
        mapper = getattr(loras._adapter_manager.model, "hf_to_vllm_mapper", None)
        adapter = LoRAModel.from_lora_tensors(
            ADAPTER_ID, tensors, helper, device="cpu", dtype=loras.lora_config.lora_dtype,
            model_vocab_size=loras.vocab_size, weights_mapper=mapper.get_rename_mapper() if mapper else None)
        slots = loras._adapter_manager
        slots.remove_adapter(ADAPTER_ID)
        slots.add_adapter(adapter)
        slots.activate_adapter(ADAPTER_ID)
        return len(tensors)

    def coati_set_logit_scale(self, factor: float) -> int:
        """Scale every LogitsProcessor of the model by ``factor`` relative to the model's own scale."""
        from vllm.model_executor.layers.logits_processor import LogitsProcessor

        count = 0
        for module in self.model_runner.get_model().modules():
            if isinstance(module, LogitsProcessor):
                base = module.__dict__.setdefault("_coati_base_scale", module.scale)
                module.scale = base * factor
                count += 1
        return count


@contextlib.contextmanager
def _opened_payload(payload) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The payload's (name, tensor) pairs; for shm/bytes, tensors are views of the mapped file or message."""
    if payload["kind"] == "inproc":
        yield list(payload["tensors"])
        return
    mapping = None
    if payload["kind"] == "shm":
        with open(payload["path"], "rb") as handle:
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapping if mapping is not None else payload["data"])
    named = []
    with warnings.catch_warnings():  # read-only buffer: the tensors are only read (copied into the model)
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        for name, dtype, shape, offset, nbytes in payload["entries"]:
            flat = torch.frombuffer(view[offset:offset + nbytes], dtype=torch.uint8) if nbytes else \
                torch.empty(0, dtype=torch.uint8)
            named.append((name, flat.view(getattr(torch, dtype)).view(shape)))
    try:
        yield named
    finally:
        named.clear()
        try:
            view.release()
            if mapping is not None:
                mapping.close()
        except BufferError:  # a tensor is still referenced somewhere: the mapping closes when it is freed
            pass


def _pack_entries(named_tensors: Iterable[tuple[str, torch.Tensor]]):
    tensors, entries, offset = [], [], 0
    for name, tensor in named_tensors:
        tensor = tensor.detach().to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        entries.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, nbytes))
        tensors.append(tensor)
        offset += (nbytes + 63) // 64 * 64  # aligned, so every view is aligned for its dtype
    return tensors, entries, offset


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()) if tensor.numel() else memoryview(b"")


def _shm_has_room(nbytes: int, directory: str = "/dev/shm") -> bool:
    try:
        stat = os.statvfs(directory)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize > 2 * nbytes + (64 << 20)


class VLLMBackend:
    """Generates with a vLLM ``LLM`` engine; weights are replaced in place between rounds.

    ``model_path`` is an HF directory (the trainer's starting point). The engine starts in the constructor
    (20-30 s on 2 CPU cores); call ``close()`` to stop its processes. ``adapters``: the run's LoRA settings
    (``RLConfig.engine_adapters``) when weight versions are adapter tensors.
    """

    def __init__(self, model_path: str, options: VLLMEngineOptions = VLLMEngineOptions(), tokenizer=None,
                 adapters=None):
        if not vllm_available():
            raise RuntimeError(INSTALL_HINT)
        from transformers import AutoTokenizer

        self.model_path, self.options, self.adapters = model_path, options, adapters
        self._environment: str | None | bool = False  # False: nothing to restore on close
        self._lora_request = None  # set once an adapter version is loaded
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        self.eos_id = self.tokenizer.eos_token_id
        on_gpu = cuda_available()
        if not on_gpu and options.tensor_parallel_size > 1:
            raise ValueError("vLLM tensor parallelism (-ptp > 1) needs CUDA GPUs; on CPU use -ptp 1")
        if os.path.isdir(model_path):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory needs no hub look-ups
        if options.multiprocessing is not None:
            # this engine's choice only, like the one below: left set, it would move every later engine of the
            # process (and of a Ray cluster started from it) out of process, ~40 s a start on a CPU
            self._environment = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if options.multiprocessing else "0"
        elif not on_gpu and not runs_in_process(model_architectures(model_path), _vllm_architectures()):
            # this engine's choice only: the environment is restored once the engine is built (a later engine of
            # a native family runs in-process again)
            self._environment = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        elif not on_gpu:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not on_gpu and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0":
            # In-process, vLLM drops torch to 1 thread "for serving" unless OMP_NUM_THREADS is set, and the
            # model's matmuls then use one core. Keep the caller's thread count (a producer sets all cores; Ray's
            # OMP_NUM_THREADS=1 for a 1-CPU actor is not meant for it in sync mode).
            threads = options.cpu_threads or torch.get_num_threads()
            os.environ["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
        quiet_vllm_logs(tied_head=False)  # the engine's start-up records (the workers add the reload's)
        import vllm.envs
        from vllm import LLM

        vllm.envs.disable_envs_cache()  # an earlier in-process engine froze the environment it saw
        self._set_num_threads = torch.set_num_threads  # an in-process CPU worker replaces it with a no-op

        engine_args = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=options.dtype,
            seed=options.seed,
            tensor_parallel_size=options.tensor_parallel_size,
            enforce_eager=(not on_gpu) if options.enforce_eager is None else options.enforce_eager,
            logprobs_mode="raw_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
            use_tqdm_on_load=False,  # a bar per engine start for a model that loads in a second or so
        )
        if adapters is not None:
            engine_args.update(enable_lora=True, max_loras=1, max_lora_rank=lora_rank_size(adapters.lora_rank))
        if options.max_model_len is not None:
            engine_args["max_model_len"] = options.max_model_len
        if options.max_num_seqs is not None:
            engine_args["max_num_seqs"] = options.max_num_seqs
        self.asleep: set[str] = set()  # sleep-mode tags (weights, kv_cache) now asleep
        if on_gpu:
            engine_args["gpu_memory_utilization"] = options.gpu_memory_utilization
            engine_args["enable_sleep_mode"] = options.sleep_mode
            if options.tensor_parallel_size > 1:
                # The inferencer's actor holds its -ptp GPUs as one placement-group bundle (placement.py): the
                # tensor-parallel workers are its own child processes on them, not Ray actors that would each
                # ask the (fully reserved) cluster for a GPU of their own.
                engine_args["distributed_executor_backend"] = "mp"
        else:
            engine_args["kv_cache_memory_bytes"] = int(options.kv_cache_gb * 2**30)
            # vLLM rewinds a seeded request's generator when its prefill is split across steps, by an offset a CPU
            # generator does not have ("CPU Generator does not use offset"): no split prefills, so per-request
            # seeds stay reproducible and a sample never depends on what else the step held.
            # vLLM then takes max(max_model_len, its CPU default) tokens a step: BackendSpec.cpu_step_budget.
            engine_args["enable_chunked_prefill"] = False
        try:
            self.llm = LLM(**engine_args)
        finally:
            # vLLM reads the variable only while building the engine: undone now, not at close(), so that an
            # engine (or a Ray cluster) started while this one lives gets its own default, not this choice
            self._restore_environment()
        engine = self.llm.llm_engine
        self.transport = "inproc" if (type(engine.engine_core).__name__ == "InprocClient" and
                                      engine.vllm_config.parallel_config.world_size == 1) else "shm"
        self._logit_scale = 1.0

    # -- generation -------------------------------------------------------------------------------------
    def _vllm_params(self, params: SamplingParams, seed: int | None = None):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            seed=seed,
            n=params.n,
            temperature=0.0 if params.greedy else 1.0,  # T itself is folded into the logits scale
            top_k=params.top_k if params.top_k > 0 else 0,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop_strings) or None,
            include_stop_str_in_output=True,  # rewards read the closing tag (e.g. </answer>)
            logprobs=0,  # the sampled token's logprob only
            skip_special_tokens=True,
        )

    def _set_logit_scale(self, scale: float) -> None:
        if scale != self._logit_scale:
            counts = self.llm.collective_rpc("coati_set_logit_scale", args=(scale,))
            if not all(counts):
                raise RuntimeError("the vLLM model has no LogitsProcessor to apply the temperature to")
            self._logit_scale = scale

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        self._set_logit_scale(1.0 / params.logprob_temperature)
        copies = params.n if params.greedy else 1  # vLLM takes n=1 only when greedy: the samples are identical
        if copies > 1:
            params = SamplingParams(**{**params.__dict__, "n": 1})
        if params.seed is None:
            request_params = self._vllm_params(params)
        else:  # one seeded generator per request (prompt), so a request's samples do not depend on the batch
            request_params = [self._vllm_params(params, (params.seed + index) % 2**63) for index in range(len(prompts))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                    request_params, use_tqdm=False, lora_request=self._lora_request)
        results = []
        for request in outputs:
            group = []
            for out in sorted(request.outputs, key=lambda o: o.index):
                tokens = list(out.token_ids)
                if out.finish_reason not in _FINISH_REASONS:
                    raise RuntimeError(f"vLLM request ended with finish reason {out.finish_reason!r}")
                logprobs = [step[token].logprob for token, step in zip(tokens, out.logprobs)]
                group.append(Completion(tokens, logprobs, _FINISH_REASONS[out.finish_reason], out.text))
            results.append([Completion(list(c.token_ids), list(c.logprobs), c.finish_reason, c.text)
                            for c in group for _ in range(copies)])
        return results

    # -- weight sync ------------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A weight version in place: the full weights, or with adapters the adapter tensors (by peft name)."""
        if self.transport == "inproc":
            tensors = list(named_tensors)
            self._rpc_load({"kind": "inproc", "tensors": tensors}, len(tensors))
            return
        tensors, entries, total = _pack_entries(named_tensors)
        if self.transport == "shm" and _shm_has_room(total):
            path = os.path.join("/dev/shm", f"coati-weights-{uuid.uuid4().hex}")
            try:
                with open(path, "wb") as handle:
                    self._write(handle, tensors, entries)
                self._rpc_load({"kind": "shm", "path": path, "entries": entries}, len(entries))
            finally:
                os.unlink(path)
            return
        data = bytearray(total)
        view = memoryview(data)
        for tensor, (_, _, _, offset, nbytes) in zip(tensors, entries):
            view[offset:offset + nbytes] = _as_bytes(tensor)
        del view
        self._rpc_load({"kind": "bytes", "data": data, "entries": entries}, len(entries))

    @staticmethod
    def _write(handle, tensors, entries) -> None:
        position = 0
        for tensor, (_, _, _, offset, nbytes) in zip(tensors, entries):
            if offset > position:
                handle.write(b"\0" * (offset - position))
            handle.write(_as_bytes(tensor))
            position = offset + nbytes

    def _rpc_load(self, payload, expected: int) -> None:
        if self.adapters is None:
            counts = self.llm.collective_rpc("coati_load_weights", args=(payload,))
        else:
            counts = self.llm.collective_rpc("coati_load_adapter", args=(payload, peft_adapter_config(self.adapters)))
        if any(count != expected for count in counts):
            raise RuntimeError(f"weight sync: workers loaded {counts} tensors, expected {expected}")
        if self.adapters is not None and self._lora_request is None:
            from vllm.lora.request import LoRARequest

            self._lora_request = LoRARequest("coati", ADAPTER_ID, lora_path="in-memory")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    # -- memory hand-over with a colocated trainer (sleep mode on GPU; nothing to do otherwise) -------------
    def sleep(self) -> None:
        if self.options.sleep_mode and cuda_available() and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def wake_up_weights(self) -> None:
        """Only the weights (before loading new ones: the KV cache stays asleep, so old weights, new weights and
        the KV cache are never on the GPU at once)."""
        if "weights" in self.asleep:
            self.llm.wake_up(tags=["weights"])
            self.asleep.discard("weights")

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up(tags=sorted(self.asleep))
            self.asleep = set()

    def close(self) -> None:
        """Stops the engine (its processes, or its in-process worker) and undoes vLLM's process-wide patch."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            self.llm = None
            torch.set_num_threads = self._set_num_threads
        self._restore_environment()

    def _restore_environment(self) -> None:
        if self._environment is not False:
            if self._environment is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = self._environment
            self._environment = False
