import asyncio

import pytest
import torch

from coati.cluster.weight_store import WeightStore
from coati.cluster.weight_sync import load_named_tensors, pack_named_tensors, unpack_named_tensors


def test_pack_round_trips_float32_and_bfloat16():
    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.arange(6).view(2, 3)}
    restored = dict(unpack_named_tensors(pack_named_tensors(tensors.items())))
    for name, tensor in tensors.items():
        assert restored[name].dtype == tensor.dtype
        assert torch.equal(restored[name], tensor)


def test_load_named_tensors_checks_names_and_coverage():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    source = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    assert load_named_tensors(model, source.named_parameters()) == 4
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), source.parameters()))
    with pytest.raises(KeyError, match="does not have"):
        load_named_tensors(model, [("nope", torch.zeros(1))])
    with pytest.raises(KeyError, match="did not send"):
        load_named_tensors(model, list(source.named_parameters())[:2])


def test_weight_store_versions_and_waiting():
    async def scenario():
        store = WeightStore()
        assert await store.latest() == (0, None)
        waiter = asyncio.create_task(store.wait_for(2, timeout_s=5))
        await store.publish(1, ["v1"])
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await store.publish(2, ["v2"])
        assert await waiter == (2, ["v2"])
        with pytest.raises(ValueError, match="must increase"):
            await store.publish(2, ["again"])
        with pytest.raises(asyncio.TimeoutError):
            await store.wait_for(3, timeout_s=0.05)

    asyncio.run(scenario())
