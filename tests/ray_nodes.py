"""A real multi-node Ray cluster on this machine, for tests: one ``ray start --block`` process per node (the
head, then workers), each with its own temp dir, ports and CPU count, all with token authentication on
(``RAY_AUTH_MODE=token`` and a token made here, as launch/ sets it up). ``stop()`` ends exactly the process
groups it started; no ``ray stop`` (that would end every Ray process on the machine)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict:
    """This process's environment without any Ray address or auth setting (an in-process local ray.init sets
    RAY_AUTH_MODE=token here), this checkout first on the path, one torch thread, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **extra)
    return env


class RayNodes:
    def __init__(self, root: str):
        self.root = str(root)
        self.token = secrets.token_hex(32)
        self.procs: list[subprocess.Popen] = []
        self.port: int | None = None
        self.temp_dirs: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict:
        """The environment of a process that holds the cluster's token (a node, or a driver)."""
        return clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, **extra)

    def _start(self, name: str, args: list[str]) -> None:
        temp_dir = os.path.join(self.root, name)  # short: Ray's socket paths must stay under ~107 characters
        os.makedirs(temp_dir)
        log = open(os.path.join(self.root, f"{name}.log"), "w")
        proc = subprocess.Popen(
            [RAY, "start", "--block", *args, "--temp-dir", temp_dir, "--node-ip-address", "127.0.0.1",
             "--num-gpus", "0", "--dashboard-agent-listen-port", str(free_port()), "--disable-usage-stats"],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        self.procs.append(proc)
        self.temp_dirs.append(temp_dir)
        deadline = time.time() + 90
        while "Ray runtime started" not in open(log.name).read():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"ray start ({name}) failed:\n{open(log.name).read()[-3000:]}")
            time.sleep(0.5)

    def start_head(self, num_cpus: int) -> None:
        self.port = free_port()
        self._start("head", ["--head", "--port", str(self.port), "--include-dashboard=false",
                             "--num-cpus", str(num_cpus)])

    def add_worker(self, num_cpus: int) -> None:
        self._start(f"worker{len(self.procs)}", ["--address", self.address, "--num-cpus", str(num_cpus)])

    def nodes(self) -> list[dict]:
        """Alive nodes as the head's GCS lists them: node_id (hex), temp_dir, CPUs, is_head."""
        import grpc
        from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

        request = gcs_service_pb2.GetAllNodeInfoRequest(state_filter=gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE)
        with grpc.insecure_channel(self.address) as channel:
            reply = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetAllNodeInfo(
                request, timeout=10, metadata=(("authorization", f"Bearer {self.token}"),))
        return [{"node_id": node.node_id.hex(), "temp_dir": node.temp_dir, "is_head": node.is_head_node,
                 "cpus": node.resources_total.get("CPU", 0.0)} for node in reply.node_info_list]

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def stop(self) -> list[int]:
        """End every process group started here (SIGTERM, then SIGKILL); the pids still left (should be none)."""
        for proc in reversed(self.procs):
            _signal_group(proc.pid, signal.SIGTERM)
        # The raylets end their workers and leave within ~10 s; the `ray start --block` processes, the GCS and the
        # autoscaler's monitor keep nothing once they are gone and never leave on SIGTERM alone: waiting for them
        # only ran out the 20 s on every stop. So: wait for the raylets and workers, then SIGKILL what is left.
        deadline = time.time() + 20
        while time.time() < deadline and any(_shuts_down_itself(pid) for proc in self.procs
                                             for pid in group_members(proc.pid)):
            time.sleep(0.2)
        for proc in self.procs:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        time.sleep(1)
        return sorted({pid for proc in self.procs for pid in group_members(proc.pid)} | set(self.leftovers()))

    def leftovers(self) -> list[int]:
        """Live processes whose command line names this cluster's directory (its GCS, raylets, workers)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmdline = handle.read().decode(errors="replace")
                with open(f"/proc/{entry}/stat") as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if self.root in cmdline and state != "Z":
                found.append(int(entry))
        return found


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _shuts_down_itself(pid: int) -> bool:
    """Whether ``pid`` is a raylet or a Ray worker: the processes a SIGTERM'd node ends on its own, in order."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().decode(errors="replace")
    except OSError:
        return False
    return "/raylet" in cmdline or "_worker.py" in cmdline


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members
