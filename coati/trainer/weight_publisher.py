"""The trainer group's weights going out: publishing a new version, snapshots for evaluation, merged adapters.

Publishing is collective (sharded weights are gathered on every rank); only the sender sends them, through its
publisher (``--weight-sync``: the object store, or a broadcast group with the producers; cluster/weight_sync.py).
With learner-side generation (``--learner-chunk-size``) the sender's own engine loads the same tensors after the
producers got theirs; with ``--colocate`` there is nobody to send to, and each rank's own engine loads them.
"""

from __future__ import annotations

import time

import ray

from coati.cluster.weight_sync import make_publisher, pack_named_tensors
from coati.models.lora import merged_tensors
from coati.registry.weight_sync import weight_sync_spec
from coati.trainer.train_state import TrainState


class WeightPublisher:
    def __init__(self, config, state: TrainState, plugin, weight_store, learner_rounds=None, colocated=None):
        """``plugin``: the policy's; ``learner_rounds`` / ``colocated``: this rank's own generator, if any."""
        self.config, self.state, self.plugin = config, state, plugin
        self.learner_rounds, self.colocated = learner_rounds, colocated
        p = config.parallel
        self.sender = None  # the sender's end of the weight sync (weight_sync.make_publisher)
        if plugin.is_weight_sender and not p.colocate:
            self.sender = make_publisher(p.weight_sync, weight_store, p.num_inferencers, p.weight_sync_bucket_mb,
                                         p.weight_sync_timeout_s)
        self.seconds = 0.0  # spent publishing since the last step's metrics took them

    def take_seconds(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def publish(self) -> None:
        """Collective: every rank takes part in gathering the full weights; the sender puts them in the store."""
        start = time.perf_counter()
        try:
            self._publish()
        finally:
            self.seconds += time.perf_counter() - start

    def _publish(self) -> None:
        state = self.state
        state.version += 1
        state.drawn_since_sync = 0
        state.trained_since_version = False
        state.published_version = state.version
        if self.colocated is not None:  # nobody else generates: the new weights go into each rank's own engine
            self.colocated.load_weights()
            return
        tensors = self.version_tensors()
        if tensors is None:
            return
        self.sender.publish(state.version, tensors)
        if self.learner_rounds is not None:  # after the producers got theirs: its next round uses these too
            self.learner_rounds.load_weights(tensors)

    def on_sync(self) -> bool:
        """Whether the weights are exactly the newest published version (nothing drawn, so nothing trained, since)."""
        return self.state.published_version == self.state.version and self.state.drawn_since_sync == 0

    def snapshot(self) -> tuple[int, list | None, bool]:
        """Collective: the current weights for an evaluation, as (newest published version, [ref] on the sender
        else None, whether the weights are exactly that version). Evaluation always reads the object store,
        whatever ``--weight-sync`` is (evaluator.py: it must see weights that were never published, and never
        hold up a publish). Right after an object-store publish the published object is reused; otherwise the
        full weights are gathered once more. The branch depends only on settings and counters equal on every
        rank, so all ranks make the same collective calls."""
        version = self.state.version
        on_sync = self.on_sync() and version > 0
        if on_sync and weight_sync_spec(self.config.parallel.weight_sync).keeps_published_object:
            return version, [self.sender.published] if self.plugin.is_weight_sender else None, True
        tensors = self.version_tensors()
        if tensors is None:
            return version, None, on_sync
        return version, [ray.put(pack_named_tensors(tensors))], on_sync

    def version_tensors(self) -> list | None:
        """Collective: one weight version as the engines load it, on the sender (None elsewhere): the trained
        tensors (with LoRA the adapters alone), or full weights merged from the adapters for an engine that
        takes no adapters (``RLConfig.merges_adapters``)."""
        merge = self.config.merges_adapters
        tensors = self.plugin.named_full_tensors(include_frozen=merge)
        if not self.plugin.is_weight_sender:
            for _ in tensors:  # non-senders yield nothing but must run the gathers
                pass
            return None
        return list(merged_tensors(tensors, self.config.model.lora) if merge else tensors)

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None
