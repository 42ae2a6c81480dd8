"""The one-GPU default of ``--colocate``: decided once the cluster is known (the run's launcher and ``--dry-run``)."""

from __future__ import annotations

import dataclasses

from coati.config.tree import RLConfig
from coati.config.validate import validate


def choose_colocation(config: RLConfig, cluster_gpus: float) -> tuple[RLConfig, str | None]:
    """(the config with ``colocate`` decided, the line that says so or None).

    ``colocate`` is None when neither --colocate/--no-colocate nor -i/-t were given: a cluster of exactly one GPU
    then trains and generates on it (the decoupled layout needs at least two), any other cluster keeps the
    decoupled layout."""
    p = config.parallel
    if p.colocate is not None:
        return config, None
    if cluster_gpus != 1:
        return dataclasses.replace(config, parallel=dataclasses.replace(p, colocate=False)), None
    chosen = dataclasses.replace(config, parallel=dataclasses.replace(p, colocate=True, num_inferencers=0))
    validate(chosen)
    return chosen, ("one GPU: the trainer generates on it too (--colocate); give -i/-t or --no-colocate for the "
                    "decoupled layout, which needs a GPU each")
