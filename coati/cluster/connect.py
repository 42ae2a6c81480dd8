"""The driver's Ray cluster: which one (local, or a running ``ray start`` cluster), and where the actors go.

Which cluster (``cluster_address``): ``RAY_ADDRESS`` when set (Ray's own convention; it wins), else
``--master_address HOST[:PORT]`` (port 6379, ``ray start --head``'s default), else a local cluster of this
process. A local run passes ``address="local"``: a bare ``ray.init()`` would instead join whatever cluster
``ray start`` last recorded in its temp directory (``<temp>/ray_current_cluster``) and then fail on
``num_cpus``, so a ``ray start`` cluster on the same machine is neither joined nor disturbed.

Joining: ``probe`` asks the head's GCS directly over gRPC before ``ray.init`` (which, on a wrong port or a
missing token, retries for ~20 s printing a log line per attempt, then raises a long traceback), so a bad
address, a missing or wrong token, or a driver on a machine that is not a node of the cluster becomes one
line within seconds. ``--ray_dir`` picks this machine's node by the temp dir its ``ray start`` used.

Token authentication (Ray >= 2.52): ``ray start --head`` turns it on when a token exists (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``; every local ``ray.init()`` creates the last one), or when
``RAY_AUTH_MODE=token``. Ray never sends a token to an address it was given unless ``RAY_AUTH_MODE=token`` is
set (a token must not leak to a wrong address), so worker nodes and the driver need ``RAY_AUTH_MODE=token``
and the head's token; the launch/ scripts do that.

Placement (``reserve``): the rule is coati/cluster/placement.py; here it is checked against
``ray.cluster_resources()`` before any actor exists, and turned into placement groups.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field

from coati.utils.machine import ENGINE_ACTOR_ENV, usable_cores

DEFAULT_RAY_PORT = 6379
_ENGINE_ACTOR = {"runtime_env": {"env_vars": ENGINE_ACTOR_ENV}}  # inferencers and the evaluator
PROBE_TIMEOUT_S = 5.0
PLACEMENT_TIMEOUT_S = 60.0  # the resources exist (checked) but other jobs may hold them
TOKEN_HELP = ("export RAY_AUTH_MODE=token and the head's token as RAY_AUTH_TOKEN (`ray get-auth-token` on the head "
              "prints it) or copy the head's ~/.ray/auth_token here; see launch/README.md")


class ClusterError(RuntimeError):
    """The cluster cannot run this job; the message is one line naming the problem and the fix."""


class TokenError(ClusterError):
    """The cluster asks for a token this process has not got, or rejects the one it has."""


def parse_address(text: str, flag: str = "--master_address") -> tuple[str, int]:
    """``HOST`` or ``HOST:PORT`` (``[v6]:PORT``) -> (host, port); port 6379 when not given."""
    text = text.strip()
    host, port = text, str(DEFAULT_RAY_PORT)
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        if rest:
            port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    if (not re.fullmatch(r"[A-Za-z0-9._:-]+", host) or not port.isdigit() or not 1 <= int(port) <= 65535
            or (":" in host and host.count(":") < 2)):
        raise ValueError(f"{flag} {text!r} is not HOST or HOST:PORT (the Ray head's address, e.g. 10.0.0.3 or "
                         f"10.0.0.3:{DEFAULT_RAY_PORT})")
    return host, int(port)


def cluster_address(master_address: str | None, environ=os.environ) -> tuple[str | None, str]:
    """(the address of the cluster to join, or None for a local one; where it came from)."""
    if environ.get("RAY_ADDRESS"):
        address = environ["RAY_ADDRESS"]
        return (None if address == "local" else address), "RAY_ADDRESS"
    if master_address:
        host, port = parse_address(master_address)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}", "--master_address"
    return None, ""


def init_ray_for(actors: int, master_address: str | None = None, ray_dir: str | None = None) -> None:
    """Join the cluster ``cluster_address`` names (after ``probe``), else start a local one, for a job of
    ``actors`` one-slot actors (a local cluster gets at least that many CPUs)."""
    import ray
    from ray.util.debug import log_once

    if ray.is_initialized():
        return
    kwargs = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=True)
    # Actors' repeated lines still fold into one "[repeated Nx across cluster]"; the one-time notice explaining
    # that (with a link) is used up here, so it never lands between the progress bar and the eval lines.
    log_once("log_dedup_warning")
    address, source = cluster_address(master_address)
    if address is None:
        ray.init(address="local", num_cpus=max(actors, usable_cores()), _temp_dir=ray_dir, **kwargs)
        return
    if "://" in address:  # from RAY_ADDRESS (the flag's form is checked with the other flags)
        raise ClusterError(f"{source} {address}: Ray Client and job-server addresses are not supported; run the "
                           "driver on a node of the cluster and pass the head's HOST[:PORT]")
    if address != "auto":  # Ray's own discovery of a cluster on this machine; nothing to probe
        probe(address, source, ray_dir)
    ray.init(address=address, _temp_dir=ray_dir, **kwargs)


def probe(address: str, source: str = "--master_address", ray_dir: str | None = None,
          timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ClusterError (one line) unless the head at ``address`` answers, accepts this process's token
    (when it asks for one), and this machine runs one of its nodes (with ``ray_dir`` as temp dir, if given)."""
    host, port = parse_address(address, source)
    target = f"{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except socket.gaierror as err:
        raise ClusterError(f"{source} {address}: cannot resolve host {host!r} ({err.strerror})") from None
    except ConnectionRefusedError:
        raise ClusterError(f"no Ray head at {target} ({source}): nothing listens there; start it with "
                           f"launch/start_head.sh {port} (ray start --head --port {port}) or fix the address") from None
    except OSError as err:  # timeout, unreachable network
        reason = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise ClusterError(f"cannot reach the Ray head at {target} ({source}): {reason} within {timeout_s:g} s; "
                           "check the address and that the port is open between the nodes") from None
    nodes = _gcs_nodes(target, source, timeout_s)
    _check_local_node(nodes, target, ray_dir)


def _gcs_nodes(target: str, source: str, timeout_s: float) -> list:
    """The cluster's alive nodes, asked of the GCS directly; auth errors become one line."""
    import grpc
    from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

    request = gcs_service_pb2.GetAllNodeInfoRequest(state_filter=gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE)
    with grpc.insecure_channel(target) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)

        def ask(metadata):
            return stub.GetAllNodeInfo(request, timeout=timeout_s, metadata=metadata).node_info_list

        try:
            try:
                return list(ask(()))
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAUTHENTICATED:
                    raise
            return list(ask(_token_metadata(target)))
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise TokenError(f"the Ray cluster at {target} rejected this process's token: use the head's "
                                   f"(`ray get-auth-token` there prints it) as RAY_AUTH_TOKEN") from None
            raise ClusterError(f"{target} ({source}) is not answering as a Ray head ({err.code().name}): is it the "
                               "port that `ray start --head` printed?") from None


def _token_metadata(target: str) -> tuple:
    """gRPC metadata with this process's token; ClusterError when the cluster needs one it has not got."""
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode

    if get_authentication_mode() != AuthenticationMode.TOKEN:
        raise TokenError(f"the Ray cluster at {target} requires its authentication token: {TOKEN_HELP}")
    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token():
        raise TokenError(f"RAY_AUTH_MODE=token but no token was found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
                           f"~/.ray/auth_token) for the Ray cluster at {target}: {TOKEN_HELP}")
    return tuple((name.lower(), value) for name, value in loader.get_token_for_http_header().items())


def _check_local_node(nodes: list, target: str, ray_dir: str | None) -> None:
    """A driver attaches to a raylet of the cluster on its own machine; say so when there is none."""
    from ray import NodeID
    from ray._private.services import find_node_ids

    local = set(find_node_ids())
    here = [node for node in nodes if NodeID(node.node_id).hex() in local]
    if not here:
        raise ClusterError(f"this machine runs no node of the Ray cluster at {target}: run the driver on one of its "
                           f"nodes (e.g. the head), or join this machine first (launch/start_worker.sh {target})")
    if ray_dir is not None:
        wanted = os.path.realpath(ray_dir)
        if not any(os.path.realpath(node.temp_dir) == wanted for node in here):
            dirs = ", ".join(sorted({node.temp_dir for node in here}))
            raise ClusterError(f"--ray_dir {ray_dir}: this machine's node of the Ray cluster at {target} uses temp "
                               f"dir {dirs}; pass that (the --temp-dir of its `ray start`), or leave --ray_dir out")


@dataclass
class Reservation:
    """The run's placement groups; ``*_options`` are the ``.options(...)`` of each actor."""

    plan: object  # placement.Plan
    trainer_group: object
    trainer_bundles: list[int]  # bundle index of each trainer rank
    inferencer_groups: list
    evaluator_group: object | None
    node_ips: dict = field(default_factory=dict)  # node id -> IP
    node_cpus: dict = field(default_factory=dict)  # node id -> CPUs Ray counts on it
    trainer_nodes: list = field(default_factory=list)  # node id of each trainer rank
    inferencer_nodes: list = field(default_factory=list)  # node id of each inferencer
    evaluator_node: str | None = None  # node id of the evaluator's bundle (GPU clusters)

    def _options(self, group, index: int, bundle: dict) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)}

    def trainer_options(self, rank: int) -> dict:
        return self._options(self.trainer_group, self.trainer_bundles[rank], self.plan.trainer_bundle)

    def inferencer_options(self, rank: int) -> dict:
        return {**self._options(self.inferencer_groups[rank], 0, self.plan.inferencer_bundle), **_ENGINE_ACTOR}

    def evaluator_options(self) -> dict:
        """A bundle on GPU clusters; on CPU clusters no slot (it shares the cores, see placement.py)."""
        if self.evaluator_group is None:
            return {"num_cpus": 0, **_ENGINE_ACTOR}
        return {**self._options(self.evaluator_group, 0, self.plan.inferencer_bundle), **_ENGINE_ACTOR}

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for group in [self.trainer_group, *self.inferencer_groups, self.evaluator_group]:
            if group is not None:
                remove_placement_group(group)


def reserve(num_inferencers: int, inferencer_tp: int, num_trainers: int, evaluator: bool,
            timeout_s: float = PLACEMENT_TIMEOUT_S) -> Reservation:
    """Check the cluster against the layout (ClusterError naming what is missing), then create and wait for
    the placement groups: the trainer group first (PACK), then one group per inferencer (``inferencer_tp``
    GPUs each), then the evaluator's when ``evaluator``."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from coati.cluster.placement import plan as make_plan
    from coati.cluster.placement import rank_order, shortfall

    cluster = ray.cluster_resources()
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    plan = make_plan(num_inferencers, inferencer_tp, num_trainers, evaluator, cluster)
    missing = shortfall(plan, cluster, [node["Resources"] for node in nodes])
    if missing:
        raise ClusterError(missing)
    trainers = placement_group([plan.trainer_bundle] * num_trainers, strategy="PACK", name="coati-trainers")
    inferencers = [placement_group([plan.inferencer_bundle], strategy="STRICT_PACK", name=f"coati-inferencer{rank}")
                   for rank in range(num_inferencers)]
    evaluator = placement_group([plan.inferencer_bundle], name="coati-evaluator") if plan.evaluator else None
    groups = [trainers, *inferencers] + ([evaluator] if evaluator else [])
    ready, _ = ray.wait([group.ready() for group in groups], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        for group in groups:
            remove_placement_group(group)
        need = ", ".join(f"{plan.total(r):g} {r}s" for r in ("GPU", "CPU") if plan.total(r))
        raise ClusterError(f"{plan.flags} needs {need}, which the cluster has but could not free within "
                           f"{timeout_s:g} s: other jobs hold them (`ray status` lists what is in use)")
    bundle_nodes = placement_group_table(trainers)["bundles_to_node_id"]
    order = rank_order([bundle_nodes[index] for index in range(num_trainers)])

    def node_of(group) -> str:
        return placement_group_table(group)["bundles_to_node_id"][0]

    return Reservation(plan, trainers, order, inferencers, evaluator,
                       {node["NodeID"]: node["NodeManagerAddress"] for node in nodes},
                       {node["NodeID"]: node["Resources"].get("CPU", 0.0) for node in nodes},
                       [bundle_nodes[index] for index in order], [node_of(group) for group in inferencers],
                       node_of(evaluator) if evaluator else None)


def node_label(place: dict) -> str:
    """'IP (node ID-PREFIX)' of a ``where`` record: several nodes may share an IP."""
    return f"{place.get('ip', '?')} (node {place.get('node_id', '?')[:8]})"


def where(actor_self) -> dict:
    """Run inside an actor (``actor.__ray_call__.remote(where)``): its node, IP, process and GPUs."""
    import ray

    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
            "gpus": [str(gpu) for gpu in context.get_accelerator_ids().get("GPU", [])]}


def wait_for_nodes(address: str, wanted: int, timeout_s: float, log, every_s: float = 10.0) -> tuple[list, str]:
    """(the alive nodes once ``wanted`` are up or ``timeout_s`` has passed, "host:port"); ``log`` gets a line
    when waiting starts, whenever the count changes and every ``every_s`` seconds, so a wait is never silent."""
    import time

    host, port = parse_address(address, "HEAD[:PORT]")
    target = f"{host}:{port}"
    start = time.time()
    last: tuple | None = None
    log(f"waiting up to {timeout_s:g} s for {wanted} alive node(s) at {target}")
    while True:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
            nodes, state = _gcs_nodes(target, "HEAD[:PORT]", PROBE_TIMEOUT_S), None
        except TokenError:
            raise
        except (OSError, ClusterError) as err:  # the head may still be starting
            nodes, state = None, err
        waited = time.time() - start
        if nodes is not None and (len(nodes) >= wanted or waited > timeout_s):
            return nodes, target
        if nodes is None and waited > timeout_s:
            raise ClusterError(f"no Ray head answers at {target} after {timeout_s:g} s ({state})")
        now = ("no head answers yet" if nodes is None else f"{len(nodes)} of {wanted} node(s) alive",
               int(waited // every_s))
        if now != last:
            log(f"{now[0]} at {target} ({waited:.0f} s of {timeout_s:g} s)")
            last = now
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    """``python -m coati.cluster.connect HEAD[:PORT] --nodes N``: wait until the cluster has N nodes."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m coati.cluster.connect",
                                     description="Wait until the Ray cluster at HEAD[:PORT] has --nodes alive nodes "
                                                 "(the head's GCS is asked directly; RAY_AUTH_* as for training); "
                                                 "progress goes to stderr while it waits.")
    parser.add_argument("address", metavar="HEAD[:PORT]")
    parser.add_argument("--nodes", type=int, default=1, help="alive nodes to wait for (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds to wait before giving up (default: %(default)g)")
    args = parser.parse_args(argv)
    try:
        nodes, target = wait_for_nodes(args.address, args.nodes, args.timeout,
                                       lambda line: print(line, file=sys.stderr, flush=True))
    except (ClusterError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    totals: dict[str, float] = {}
    for node in nodes:
        for name in ("GPU", "CPU"):
            totals[name] = totals.get(name, 0.0) + node.resources_total.get(name, 0.0)
    summary = (f"{len(nodes)} node(s) at {target}: {totals['GPU']:g} GPUs, {totals['CPU']:g} CPUs "
               f"({', '.join(sorted(node.node_manager_address for node in nodes))})")
    if len(nodes) < args.nodes:
        print(f"error: {summary}; waited {args.timeout:g} s for {args.nodes}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
