"""A trainer rank's part of a checkpoint: what each rank writes into, and reads back from, the checkpoint
directory the driver stages (coati/launcher/checkpoints.py owns the directory, its run state and ``--resume``).

- ``trainer_state/<role>/``: each trained model's plugin ``save_state`` (``actor``, and ``critic`` for PPO;
  parameters and optimizer state, one shard per rank for sharded plugins; ``coati.plugins.state``); an SFT/RM
  stage writes its one model the same way;
- ``consumer_state/rank_R.pt`` (RL runs): each trainer rank's ``TrainState`` (train_state.py): counters (steps,
  groups drawn, draw serial, weight version, rounds drawn, and the algorithm's own state, e.g. PPO's KL
  coefficient), RNG states, and a save inside a round's steps (round-level minibatches, round_batches.py) the round's groups and its steps still to
  train;
- the policy as an HF directory (``model.safetensors``, ``config.json``, tokenizer files), written by the
  sending rank: ``from_pretrained`` loads the checkpoint, the other entries are ignored by transformers.

Every rank writes into the same staging directory (a filesystem all ranks and the driver share).
"""

from __future__ import annotations

import os

import torch

from coati.trainer.train_state import COUNTERS

TRAINER_STATE = "trainer_state"
CONSUMER_STATE = "consumer_state"


def save_trained_models(roles, checkpoint: str) -> None:
    """Collective: every role's plugin state under ``checkpoint/trainer_state/<role>/``."""
    for role in roles:
        role.save_state(os.path.join(checkpoint, TRAINER_STATE))


def load_trained_models(roles, checkpoint: str) -> None:
    """Collective, after setup: every role's plugin state from ``checkpoint`` (any layout the plugin reads)."""
    for role in roles:
        role.load_state(os.path.join(checkpoint, TRAINER_STATE))


def save_consumer(consumer, staging: str) -> dict:
    """Collective: HF export (the sender writes), the plugin's trainer state (every rank its shards), and this
    rank's ``TrainState`` with the algorithm's own state among its counters. Returns the counters (equal on every
    rank)."""
    consumer.save_pretrained(staging)
    save_trained_models(consumer.roles.values(), staging)
    state = consumer.state.state_dict()
    state["counters"].update(consumer.algorithm.state())
    os.makedirs(os.path.join(staging, CONSUMER_STATE), exist_ok=True)
    torch.save({**state, "world_size": consumer.plugin.world_size},
               os.path.join(staging, CONSUMER_STATE, f"rank_{consumer.rank}.pt"))
    return state["counters"]


def load_consumer(consumer, path: str) -> dict:
    """Collective, after ``setup``: trainer state (any layout the plugin can read), counters, RNG states, and
    the checkpoint's weights published again under their version (the store of a new run starts at 0)."""
    load_trained_models(consumer.roles.values(), path)
    own = os.path.join(path, CONSUMER_STATE, f"rank_{consumer.rank}.pt")
    state = torch.load(own if os.path.isfile(own) else os.path.join(path, CONSUMER_STATE, "rank_0.pt"),
                       weights_only=False)
    counters = {name: value for name, value in state["counters"].items() if name in COUNTERS}
    consumer.algorithm.load_state({name: value for name, value in state["counters"].items() if name not in COUNTERS})
    train_state = consumer.state
    if counters["version"] > 0:  # evaluation and late producers read the newest weights from the store
        train_state.version = counters["version"] - 1
        consumer.weights.publish()
    # RNG states only from this rank's own file in the same layout: in another, ranks do not correspond and the
    # seeding of setup() stays (the policy has no dropout).
    train_state.load_state_dict(state, restore_rng=os.path.isfile(own) and state["world_size"] == consumer.plugin.world_size)
    if train_state.round is not None:  # saved inside a round: its remaining steps come first, on the same permutation
        train_state.round.tensors = consumer.algorithm.round_tensors(train_state.round.kept)
    schedule = consumer.config.schedule
    for generator in (consumer.learner_rounds, consumer.colocated):  # each fills a round at the round's first draw
        if generator is not None:
            generator.last_round = schedule.own_rounds_filled(train_state.version, train_state.drawn_since_sync)
    return counters
