"""Weight-sync transports: how a published weight version reaches the inferencers (``--weight-sync``)."""

from __future__ import annotations

from dataclasses import dataclass

from coati.registry import lookup


@dataclass(frozen=True)
class WeightSyncSpec:
    name: str
    publisher: str  # "module:function" (store, num_inferencers, bucket_mb, timeout_s) -> publisher
    receiver: str  # "module:function" (store, rank, num_inferencers, timeout_s) -> receiver
    keeps_published_object: bool = False  # the publisher holds the published version as one object-store ref
    default: bool = False  # the transport of a run without inferencers (--colocate)


WEIGHT_SYNCS: dict[str, WeightSyncSpec] = {spec.name: spec for spec in (
    WeightSyncSpec("object-store", "coati.cluster.weight_sync:object_store_publisher",
                   "coati.cluster.weight_sync:object_store_receiver", keeps_published_object=True, default=True),
    WeightSyncSpec("collective", "coati.cluster.weight_sync:CollectivePublisher",
                   "coati.cluster.weight_sync:collective_receiver"),
)}
DEFAULT_WEIGHT_SYNC = next(name for name, spec in WEIGHT_SYNCS.items() if spec.default)


def weight_sync_spec(name: str) -> WeightSyncSpec:
    return lookup(WEIGHT_SYNCS, name, "weight-sync transport")
