"""What a run needs from the Ray cluster, whether the cluster can hold it, and where trainer ranks go (pure).

The unit is a GPU when the cluster has any, otherwise a CPU slot:

- each inferencer is one bundle on one node: ``-ptp`` GPUs (vLLM's tensor parallelism stays inside a
  node, where its all-reduces run over NVLink/PCIe) and one CPU; on a CPU cluster one CPU slot;
- the trainer group is one placement group of ``-t`` one-unit bundles, PACK (as few nodes as they fit
  on), created first so that it takes whole nodes before the inferencers fill the rest;
- on a GPU cluster the -ei evaluator has a bundle like an inferencer's; on a CPU cluster it shares cores
  (no slot), as the buffer and the weight store do.

``shortfall`` compares that with the cluster's totals and its nodes before any actor exists and returns
the one line to show when it cannot fit (``None`` when it can). ``rank_order`` lays the trainer ranks out
over the nodes the group landed on, consecutive ranks on one node (tensor-parallel peers are neighbours).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    unit: str  # "GPU" or "CPU"
    num_inferencers: int
    inferencer_tp: int
    num_trainers: int
    evaluator: bool  # the -ei evaluator has a bundle of its own (GPU clusters)

    @property
    def inferencer_bundle(self) -> dict[str, float]:
        return {"GPU": float(self.inferencer_tp), "CPU": 1.0} if self.unit == "GPU" else {"CPU": 1.0}

    @property
    def trainer_bundle(self) -> dict[str, float]:
        return {"GPU": 1.0, "CPU": 1.0} if self.unit == "GPU" else {"CPU": 1.0}

    def bundles(self) -> list[tuple[str, dict[str, float]]]:
        """(what, resources) of every bundle, in creation order: trainer ranks, inferencers, evaluator."""
        out = [(f"trainer rank {rank}", self.trainer_bundle) for rank in range(self.num_trainers)]
        out += [(f"inferencer {rank}", self.inferencer_bundle) for rank in range(self.num_inferencers)]
        if self.evaluator:
            out.append(("evaluator", self.inferencer_bundle))
        return out

    def total(self, resource: str) -> float:
        return sum(bundle.get(resource, 0.0) for _, bundle in self.bundles())

    @property
    def flags(self) -> str:
        ptp = f" -ptp {self.inferencer_tp}" if self.inferencer_tp > 1 else ""
        return f"-i {self.num_inferencers}{ptp} -t {self.num_trainers}" + (" with the -ei evaluator" if self.evaluator else "")


def plan(num_inferencers: int, inferencer_tp: int, num_trainers: int, eval_actor: bool,
         cluster: dict[str, float]) -> Plan:
    """The plan for these flags on a cluster whose total resources are ``cluster`` (ray.cluster_resources())."""
    unit = "GPU" if cluster.get("GPU", 0) >= 1 else "CPU"
    return Plan(unit, num_inferencers, inferencer_tp if unit == "GPU" else 1, num_trainers,
                evaluator=eval_actor and unit == "GPU")


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def shortfall(plan: Plan, cluster: dict[str, float], nodes: list[dict[str, float]]) -> str | None:
    """One line naming what the cluster lacks for ``plan``, or None when every bundle fits.

    ``nodes``: each alive node's total resources. Totals first (the clearest message), then whether an
    inferencer's bundle fits on any single node, then a first-fit-decreasing packing of all bundles onto the
    nodes. With bundle sizes -ptp and 1 that packing is exact for the unit (the -ptp bundles go first, as many
    per node as fit, and the 1-unit bundles fill whatever is left); the one CPU every GPU bundle also takes
    could only mislead it on a node with fewer CPUs than GPUs.
    """
    fix = "add nodes or lower -i/-t" + ("/-ptp" if plan.inferencer_tp > 1 else "")
    if plan.num_inferencers and _fits_colocated(plan, cluster, nodes):
        fix = (f"add nodes, or train and generate on the trainers' {plan.unit}s (it fits): "
               f"--colocate -t {plan.num_trainers}")
    for resource in ("GPU", "CPU"):
        need, have = plan.total(resource), cluster.get(resource, 0.0)
        if need > have:
            detail = "" if resource == "GPU" else (" (one per inferencer and trainer rank"
                                                   + (", beside the GPUs)" if plan.unit == "GPU" else ")"))
            return f"{plan.flags} needs {_count(need)} {resource}s{detail}; the cluster has {_count(have)}: {fix}"
    if plan.unit == "GPU" and plan.inferencer_tp > 1:
        largest = max((node.get("GPU", 0.0) for node in nodes), default=0.0)
        if largest < plan.inferencer_tp:
            return (f"-ptp {plan.inferencer_tp} needs {plan.inferencer_tp} GPUs on one node for each inferencer "
                    f"(vLLM tensor parallelism stays inside a node); the largest node has {_count(largest)}: "
                    f"lower -ptp")
    if not _first_fit(plan, nodes):
        per_node = ", ".join(_count(node.get(plan.unit, 0.0)) for node in nodes)
        return (f"{plan.flags} needs {_count(plan.total(plan.unit))} {plan.unit}s in bundles of "
                f"{_count(plan.inferencer_bundle[plan.unit])} per inferencer and 1 per trainer rank, which the "
                f"nodes' {plan.unit}s ({per_node}) cannot hold: {fix}")
    return None


def _fits_colocated(plan: Plan, cluster: dict[str, float], nodes: list[dict[str, float]]) -> bool:
    """Whether the trainer ranks alone (--colocate: no inferencers, no evaluator bundle) fit the cluster."""
    colocated = Plan(plan.unit, 0, 1, plan.num_trainers, evaluator=False)
    return (all(colocated.total(resource) <= cluster.get(resource, 0.0) for resource in ("GPU", "CPU"))
            and _first_fit(colocated, nodes))


def _first_fit(plan: Plan, nodes: list[dict[str, float]]) -> bool:
    free = [dict(node) for node in nodes]
    for _, bundle in sorted(plan.bundles(), key=lambda item: -item[1].get(plan.unit, 0.0)):
        for node in free:
            if all(node.get(name, 0.0) >= amount for name, amount in bundle.items()):
                for name, amount in bundle.items():
                    node[name] -= amount
                break
        else:
            return False
    return True


def rank_order(bundle_nodes: list[str]) -> list[int]:
    """Bundle index for each trainer rank: ranks fill one node's bundles before the next node's (nodes in the
    order of their first bundle), so consecutive ranks (tensor- and pipeline-parallel peers) share a node
    however Ray numbered the bundles it packed."""
    order: dict[str, list[int]] = {}
    for index, node in enumerate(bundle_nodes):
        order.setdefault(node, []).append(index)
    return [index for indices in order.values() for index in indices]
