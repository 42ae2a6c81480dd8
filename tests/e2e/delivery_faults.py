"""Faults in weight delivery, injected into every Ray worker of a test's cluster (``worker_process_setup_hook``:
``install``). The hook replaces the producers' weight loading, in the worker process, before any actor is built;
which fault acts is read from the file ``$COATI_TEST_FAULT_FILE`` names at each load, so that one cluster serves
runs with different faults (Ray may hand an actor a worker process started for an earlier run).

- ``stale``: the engines take each new version's number without loading its weights: they go on generating with
  the weights they started with and label the rows with the new version.
- ``drop_tensor``: the transport loses one tensor of every version (layer 0's MLP down-projection) and the
  engine loads the rest without complaint, as an engine that does not count what it received would.
- ``drop_adapters``: with ``--lora-rank``, the transport delivers a version without its adapters: the engine keeps
  the adapters it had (those of the start), as in verl #7495's async LoRA runs.
"""

import os

FAULT_FILE = "COATI_TEST_FAULT_FILE"


def fault() -> str:
    try:
        with open(os.environ[FAULT_FILE]) as handle:
            return handle.read().strip()
    except (KeyError, OSError):
        return ""


def lossy_load(backend, drop):
    """A load into the transformers ``backend``'s model of every tensor except those ``drop(name)`` selects, with
    no check that the version was complete."""
    import torch

    def load(named_tensors) -> None:
        params = dict(backend.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                if not drop(name):
                    params[name].copy_(tensor.to(params[name].dtype))

    return load


DROPPED = {"drop_tensor": lambda name: name.endswith("layers.0.mlp.down_proj.weight"),
           "drop_adapters": lambda name: "lora_" in name}


def install() -> None:
    from coati.rollout.producer import Producer

    original = Producer._sync_weights

    def sync(self, min_version, timeout_s=600.0):
        kind = fault()
        if kind == "stale":
            self.version = self.weights.load_newest(lambda named_tensors: None, self.version, min_version, timeout_s)
        elif kind in DROPPED:
            load = lossy_load(self.backend, DROPPED[kind])
            self.version = self.weights.load_newest(load, self.version, min_version, timeout_s)
        else:
            original(self, min_version, timeout_s)

    Producer._sync_weights = sync
