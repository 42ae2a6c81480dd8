"""The one device rule for model holders (coati/utils/device.py): a table of cases, and the holders use it."""

import pytest
import torch

from coati.utils.device import ROLES, device_rule, granted_gpus, local_indices, model_placement

CPU, GPU0, GPU2 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 2)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
FROZEN = tuple(role for role in ROLES if role not in ("policy", "critic"))

CASES = [
    # gpus, backend, role, dtype flag, trainer precision -> device, dtype
    ((), "transformers", "producer", "auto", "fp32", CPU, F32),
    ((), "vllm", "producer", "auto", "bf16", CPU, F32),  # CPU runs stay fp32 whatever the trainer does
    ((), "transformers", "reference", "auto", "fp32", CPU, F32),
    ((), "transformers", "evaluator", "bf16", "fp32", CPU, BF16),  # an explicit dtype is honoured on the CPU
    ((), "transformers", "policy", "bf16", "bf16", CPU, F32),  # trained: fp32 master weights
    ((0,), "transformers", "producer", "auto", "fp32", GPU0, BF16),
    ((0,), "vllm", "producer", "auto", "fp16", GPU0, F16),
    ((0,), "transformers", "reward_model", "auto", "bf16", GPU0, BF16),
    ((0,), "transformers", "reference", "fp32", "fp32", GPU0, F32),
    ((0,), "transformers", "learner_generation", "auto", "fp32", GPU0, BF16),
    ((0,), "transformers", "evaluate", "auto", "fp32", GPU0, BF16),
    ((0,), "transformers", "critic", "auto", "bf16", GPU0, F32),
    ((2, 3), "vllm", "evaluator", "auto", "fp32", GPU2, BF16),  # -ptp 2: the engine's first GPU
]


@pytest.mark.parametrize("gpus,backend,role,dtype,precision,device,expected", CASES)
def test_device_rule_table(gpus, backend, role, dtype, precision, device, expected):
    placement = device_rule(gpus, backend, role, dtype, precision)
    assert (placement.device, placement.dtype) == (device, expected)
    assert placement.on_gpu == bool(gpus)


def test_every_frozen_role_is_fp32_on_cpu_and_bf16_on_a_gpu():
    for role in FROZEN:
        for backend in ("transformers", "vllm"):
            assert device_rule((), backend, role).dtype == F32
            assert device_rule((1,), backend, role).device == torch.device("cuda", 1)
            assert device_rule((1,), backend, role).vllm_dtype == "bfloat16"


@pytest.mark.parametrize("args,word", [(((), "transformers", "critic2"), "role"), (((), "sglang", "producer"), "backend"),
                                       (((), "vllm", "producer", "int8"), "dtype"),
                                       (((), "vllm", "producer", "auto", "fp8"), "precision")])
def test_bad_input_is_one_line_naming_it(args, word):
    with pytest.raises(ValueError, match=word) as err:
        device_rule(*args)
    assert "\n" not in str(err.value)


def test_ray_ids_map_to_torch_indices_through_visible_devices():
    assert local_indices([3], "3") == [0]  # Ray's usual case: only the granted GPU is visible
    assert local_indices([5, 7], "4,5,6,7") == [1, 3]
    assert local_indices([1], None) == [1]
    assert local_indices([], "0,1") == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU answer")
def test_this_cpu_process_gets_the_cpu_in_fp32():
    assert granted_gpus() == []
    assert model_placement("producer") == device_rule((), "transformers", "producer")


def test_run_config_routes_its_flags_to_the_rule():
    from coati.config.layout import ParallelConfig

    if torch.cuda.is_available():
        pytest.skip("checks the CPU answer")
    assert ParallelConfig().model_placement("reference").dtype == F32
    assert ParallelConfig(model_dtype="bf16").model_placement("producer").dtype == BF16
    assert ParallelConfig(model_dtype="bf16").model_placement("policy").dtype == F32


def test_transformers_backend_loads_where_the_placement_says(tiny_model_dir):
    from coati.config.sampling import SamplingParams
    from coati.rollout.inference_backend import TransformersBackend

    params = SamplingParams(n=2, max_new_tokens=4, seed=3)
    default = TransformersBackend.from_pretrained(tiny_model_dir)
    ruled = TransformersBackend.from_pretrained(tiny_model_dir, placement=device_rule((), "transformers", "producer"))
    assert ruled.model.dtype == F32 and ruled.model.device == CPU
    a, b = default.generate([[5, 6, 7]], params), ruled.generate([[5, 6, 7]], params)
    assert [(c.token_ids, c.logprobs) for c in a[0]] == [(c.token_ids, c.logprobs) for c in b[0]]
    bf16 = TransformersBackend.from_pretrained(tiny_model_dir, placement=device_rule((), "transformers", "producer",
                                                                                     "bf16"))
    assert bf16.model.dtype == BF16
    out = bf16.generate([[5, 6, 7]], params)[0]
    assert all(len(c.logprobs) == len(c.token_ids) for c in out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_producer_backend_generates_there_in_bf16(tiny_model_dir):
    from coati.config.sampling import SamplingParams
    from coati.rollout.inference_backend import TransformersBackend

    backend = TransformersBackend.from_pretrained(tiny_model_dir, placement=model_placement("producer"))
    assert backend.model.device.type == "cuda" and backend.model.dtype == BF16
    out = backend.generate([[5, 6, 7]], SamplingParams(n=2, max_new_tokens=4, seed=3))[0]
    assert len(out) == 2 and all(len(c.logprobs) == len(c.token_ids) for c in out)
