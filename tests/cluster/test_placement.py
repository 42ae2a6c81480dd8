"""The placement rule (coati/cluster/placement.py) against hand-counted clusters; no Ray."""

from __future__ import annotations

from coati.cluster.placement import plan, rank_order, shortfall


def gpu_nodes(*gpus, cpus=32):
    return [{"GPU": float(n), "CPU": float(cpus)} for n in gpus]


def totals(nodes):
    out = {}
    for node in nodes:
        for name, value in node.items():
            out[name] = out.get(name, 0.0) + value
    return out


def check(i, ptp, t, nodes, evaluator=False):
    cluster = totals(nodes)
    return shortfall(plan(i, ptp, t, evaluator, cluster), cluster, nodes)


def test_gpu_bundles_and_totals():
    p = plan(4, 2, 4, False, {"GPU": 16.0, "CPU": 64.0})
    assert p.unit == "GPU"
    assert p.inferencer_bundle == {"GPU": 2.0, "CPU": 1.0} and p.trainer_bundle == {"GPU": 1.0, "CPU": 1.0}
    assert p.total("GPU") == 4 * 2 + 4 and p.total("CPU") == 8
    assert [what for what, _ in p.bundles()][:2] == ["trainer rank 0", "trainer rank 1"]  # the trainer group first


def test_too_few_gpus_names_the_flags_and_the_counts():
    assert check(4, 2, 16, gpu_nodes(8)) == (
        "-i 4 -ptp 2 -t 16 needs 24 GPUs; the cluster has 8: add nodes or lower -i/-t/-ptp")
    # the trainer ranks alone would fit: the line names the colocated layout (--colocate)
    assert check(4, 2, 4, gpu_nodes(8)) == ("-i 4 -ptp 2 -t 4 needs 12 GPUs; the cluster has 8: add nodes, or train "
                                            "and generate on the trainers' GPUs (it fits): --colocate -t 4")


def test_cpu_cluster_counts_one_slot_per_actor():
    nodes = [{"CPU": 1.0}, {"CPU": 2.0}]
    p = plan(2, 1, 2, True, totals(nodes))
    assert p.unit == "CPU" and p.inferencer_bundle == {"CPU": 1.0} and not p.evaluator  # the evaluator shares cores
    assert check(2, 1, 2, nodes, evaluator=True) == (
        "-i 2 -t 2 needs 4 CPUs (one per inferencer and trainer rank); the cluster has 3: add nodes, or train and "
        "generate on the trainers' CPUs (it fits): --colocate -t 2")
    assert check(2, 1, 4, nodes).endswith("the cluster has 3: add nodes or lower -i/-t")
    assert check(1, 1, 2, nodes) is None


def test_cpus_are_checked_beside_the_gpus():
    nodes = gpu_nodes(8, cpus=4)
    assert check(4, 1, 4, nodes) == ("-i 4 -t 4 needs 8 CPUs (one per inferencer and trainer rank, beside the GPUs); "
                                     "the cluster has 4: add nodes, or train and generate on the trainers' GPUs (it "
                                     "fits): --colocate -t 4")
    assert check(2, 1, 6, nodes).endswith("the cluster has 4: add nodes or lower -i/-t")  # 6 ranks: 6 CPUs


def test_inferencer_tensor_parallelism_must_fit_inside_one_node():
    # 8 GPUs in all, enough for 1 x 4 + 1, but no node has 4
    assert check(1, 4, 1, gpu_nodes(2, 2, 2, 2)) == (
        "-ptp 4 needs 4 GPUs on one node for each inferencer (vLLM tensor parallelism stays inside a node); "
        "the largest node has 2: lower -ptp")


def test_fragmented_nodes_cannot_hold_the_bundles():
    # 7 GPUs for 3 x 2 + 1: the totals match, but a 3-GPU node holds one 2-GPU bundle and a 1-GPU node none
    assert check(3, 2, 1, gpu_nodes(3, 3, 1)) == (
        "-i 3 -ptp 2 -t 1 needs 7 GPUs in bundles of 2 per inferencer and 1 per trainer rank, which the nodes' "
        "GPUs (3, 3, 1) cannot hold: add nodes, or train and generate on the trainers' GPUs (it fits): --colocate -t 1")
    assert check(2, 2, 3, gpu_nodes(3, 3, 1)) is None  # 2-GPU bundles on the 3-GPU nodes, trainers in the gaps


def test_the_seed_example_fits_four_8_gpu_nodes():
    assert check(16, 1, 16, gpu_nodes(8, 8, 8, 8)) is None
    assert check(16, 1, 16, gpu_nodes(8, 8, 8, 8), evaluator=True).startswith(
        "-i 16 -t 16 with the -ei evaluator needs 33 GPUs; the cluster has 32")


def test_ranks_fill_one_node_before_the_next():
    assert rank_order(["a", "a", "a", "a"]) == [0, 1, 2, 3]
    assert rank_order(["b", "a", "b", "a"]) == [0, 2, 1, 3]  # node b's bundles take ranks 0-1, node a's 2-3
    assert rank_order([]) == []
