"""Collective weight sync (``--weight-sync collective``): the sending trainer rank broadcasts full weights in
buckets to every producer over a torch.distributed group of their own.

The group. Rank 0 is the trainer rank that sends (``plugin.is_weight_sender``), rank 1 + r is producer r; gloo
on CPU, nccl when the trainers train on CUDA (the role cupy's NCCL group plays in ColossalChat). It is built
directly from a store, not through ``init_process_group``: producers need no default group, and the trainers'
own group is untouched. The sender hosts a TCPStore; producers find it through the WeightStore actor. Everything
that is not tensor data (who is here, which version comes next, moving to a new group) goes through that store,
so nobody enters a collective before every member has said it is ready for it: a missing producer is a named
timeout, never a hang inside gloo.

Generations. A group's membership is fixed, so every producer start registers a new *incarnation* (counter
``member/<r>``). The sender's thread notices a new incarnation within a poll interval, forms a new generation
(a fresh rendezvous under the prefix ``g<G>/``) from the newest incarnation of every producer, tells the members
of the old one to move (a ``reform`` message) and sends the newest version again. A producer restarted by Ray
therefore gets the current weights at once, without waiting for the next publish (the trainers may be waiting for
that producer's round). A member whose group breaks (a peer died mid-transfer) registers again the same way.

One sync (version v, in generation G, message n):
  sender     ``g<G>/msg/<n>`` = "sync v layout"      receivers: take the staging lock, post ``ready/<n>/<rank>``
  sender     waits for every ready (while watching for new incarnations), then ``go/<n>`` = "go"
  all        one broadcast per bucket; each member writes its per-bucket checksums into its row of a
             [members, buckets] table, all-reduced: a row unequal to the sender's is a failed delivery. The sender
             raises naming the producer, the version and the bucket; every receiver discards the version.
Receivers receive into a CPU staging copy in a background thread, so a publish never waits for a producer to
finish generating; the producer loads the newest verified version at its own load points (round start, between
``-imbs`` chunks), exactly where it reads the object store otherwise. Memory: one staging copy per producer and
two bucketed copies on the sender, used in turn (the object store keeps one copy per node instead).
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from coati.cluster.buckets import (
    ALIGN,
    Slot,
    WeightSyncError,
    checksum,
    fill_buckets,
    layout_id,
    mismatches,
    plan_buckets,
    tensor_views,
)
from coati.cluster.sync_group import POLL_MAX_S, allreduce, broadcast, group_device, make_group, pipelined, wait_key


@dataclass
class _Version:
    version: int
    layout: str
    buckets: list[torch.Tensor]
    sums: list[int]


class CollectiveSender:
    """Lives in the sending trainer rank. ``publish`` blocks until every producer holds the version (checksums
    compared) or raises; a background thread does the work and also serves producers that (re)join later."""

    def __init__(self, num_producers: int, bucket_mb: float, timeout_s: float, backend: str = "gloo",
                 host: str = "127.0.0.1"):
        self.num_producers, self.timeout_s, self.backend = num_producers, timeout_s, backend
        self.bucket_bytes = max(ALIGN, int(bucket_mb * 2**20))
        self.store = dist.TCPStore(host, 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        self.address = (host, self.store.port)
        self.store.set("backend", backend)
        self._layout: tuple[list[Slot], list[int], str] | None = None
        self._spare: list[list[torch.Tensor]] = []  # two sets of buckets (reused: fresh memory pages in slowly)
        self._cond = threading.Condition()
        self._newest: _Version | None = None
        self._delivered = 0  # the newest version every producer holds
        self._error: BaseException | None = None
        self._waiting_on = "producers to register"  # what the thread waits for now (for timeout messages)
        self._missing: list[int] = list(range(num_producers))
        self._stop = False
        # generation state (thread only)
        self.generation = 0
        self._members: list[int] | None = None  # incarnation of every producer in the current generation
        self._group = None
        self._msg = 0  # next message number in the current generation
        self._sent = 0  # newest version delivered in the current generation
        self._thread = threading.Thread(target=self._serve, name="weight-sync-sender", daemon=True)
        self._thread.start()

    # --- trainer side ---
    def publish(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        tensors = list(named_tensors)
        specs = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors]
        if self._layout is None or [(s.name, s.dtype, s.shape) for s in self._layout[0]] != specs:
            slots, sizes = plan_buckets(specs, self.bucket_bytes)
            self._layout = (slots, sizes, layout_id(slots, sizes))
            self.store.set(f"layout/{self._layout[2]}", json.dumps(
                {"slots": [[s.name, s.dtype, list(s.shape), s.bucket, s.offset, s.nbytes] for s in slots],
                 "sizes": sizes}))
            self._spare = [[torch.zeros(size, dtype=torch.uint8) for size in sizes] for _ in range(2)]
        slots, sizes, layout = self._layout
        # Two sets of buckets, used in turn: the thread may still re-send the previous version (a producer joined)
        # while this one is filled, never the one before (that publish waited for its thread to move on).
        buckets = self._spare[version % 2]
        fill_buckets(tensors, slots, buckets)
        entry = _Version(version, layout, buckets, [checksum(b) for b in buckets])
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            self._raise_error()
            self._newest = entry
            self._cond.notify_all()
            while self._delivered < version and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    ranks = ", ".join(map(str, self._missing)) or "?"
                    raise TimeoutError(
                        f"weight sync: version {version} did not reach producer {ranks} within {self.timeout_s:g} s "
                        f"(waiting for {self._waiting_on}; generation {self.generation}); raise "
                        f"--weight-sync-timeout if producers are slow to start, else check that producer's log")
                self._cond.wait(min(remaining, 1.0))
            self._raise_error()

    def close(self) -> None:
        """Tell the producers the run is over and stop the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        if self._members is not None:
            self.store.set(f"g{self.generation}/msg/{self._msg}", "close")
        self._group = None

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    # --- the thread ---
    def _serve(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                if self._newest is None or self._newest.version <= self._sent:
                    self._cond.wait(POLL_MAX_S * 4)  # also polls for restarted producers
                newest = self._newest
            try:
                incarnations = [self.store.add(f"member/{r}", 0) for r in range(self.num_producers)]
                if 0 in incarnations:
                    self._set_waiting([r for r, i in enumerate(incarnations) if i == 0], "producers to register")
                    time.sleep(POLL_MAX_S)
                    continue
                if incarnations != self._members:
                    if not self._form(incarnations):
                        continue
                if newest is not None and newest.version > self._sent:
                    self._sync(newest)
            except WeightSyncError as err:
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                return
            except Exception as err:  # a member died inside a collective: it registers again, then we re-form
                self._members, self._group = None, None
                self._set_waiting(list(range(self.num_producers)), f"the group to re-form after a failed transfer "
                                                                   f"({type(err).__name__}: {err})")
                time.sleep(POLL_MAX_S)

    def _set_waiting(self, ranks: list[int], what: str) -> None:
        with self._cond:
            self._missing, self._waiting_on = ranks, what

    def _stopping(self) -> bool:
        return self._stop

    def _changed(self) -> bool:
        return [self.store.add(f"member/{r}", 0) for r in range(self.num_producers)] != self._members

    def _post(self, key: str, value: str) -> None:
        self.store.set(f"g{self.generation}/{key}", value)

    def _form(self, incarnations: list[int]) -> bool:
        """Start generation G+1 with these incarnations; True once its group is built."""
        if self.generation > 0:  # members of the old generation wait for its next message (or a go): both say move
            self._post(f"msg/{self._msg}", f"reform {self.generation + 1}")
            self._post(f"go/{self._msg}", f"reform {self.generation + 1}")
        self.generation += 1
        self._members, self._group, self._msg, self._sent = None, None, 0, 0
        for rank, incarnation in enumerate(incarnations):
            self.store.set(f"joined/{rank}/{incarnation}", str(self.generation))
        waiting = list(range(self.num_producers))
        while waiting:
            self._set_waiting(waiting, f"producers to join generation {self.generation}")
            waiting = [r for r in waiting if not self.store.check([f"g{self.generation}/here/{r}"])]
            if [self.store.add(f"member/{r}", 0) for r in range(self.num_producers)] != incarnations:
                return False  # the next pass forms G+1 and moves those already here
            if self._stop:
                return False
            if waiting:
                time.sleep(POLL_MAX_S)
        self._post("start", "1")
        self._group = make_group(self.store, self.generation, 0, self.num_producers + 1, self.backend, self.timeout_s)
        self._members = incarnations
        self._set_waiting([], "nothing")
        return True

    def _sync(self, entry: _Version) -> None:
        n = self._msg
        self._msg += 1
        self._post(f"msg/{n}", f"sync {entry.version} {entry.layout}")
        waiting = list(range(self.num_producers))
        while waiting:
            self._set_waiting(waiting, f"version {entry.version}'s receivers to be ready")
            waiting = [r for r in waiting if not self.store.check([f"g{self.generation}/ready/{n}/{r}"])]
            if waiting:
                if self._stop:
                    return
                if self._changed():  # a producer restarted: move everyone to a new generation first
                    self._post(f"go/{n}", f"reform {self.generation + 1}")
                    self._members = None
                    return
                time.sleep(POLL_MAX_S / 5)
        self._post(f"go/{n}", "go")
        self._set_waiting(list(range(self.num_producers)), f"version {entry.version}'s transfer")
        device = group_device(self.backend)

        def start(index):
            bucket = entry.buckets[index].to(device)
            return broadcast(self._group, bucket), bucket

        for _ in pipelined(entry.buckets, start):
            pass
        table = torch.zeros(self.num_producers + 1, len(entry.buckets), dtype=torch.int64,
                            device=group_device(self.backend))
        table[0] = torch.tensor(entry.sums, dtype=torch.int64)
        allreduce(self._group, table)
        bad = mismatches(table.cpu())
        if bad:
            member, bucket = bad[0]
            raise WeightSyncError(
                f"weight sync: producer {member - 1} does not hold what was sent for version {entry.version} "
                f"(bucket {bucket} of {len(entry.buckets)}: checksum {int(table[member, bucket])}, sent "
                f"{entry.sums[bucket]}; {len(bad)} bad bucket(s) in all); the transfer was corrupted")
        self._sent = entry.version
        with self._cond:
            self._delivered = max(self._delivered, entry.version)
            self._missing, self._waiting_on = [], "nothing"
            self._cond.notify_all()


class CollectiveReceiver:
    """Lives in a producer: a background thread receives every version into a CPU staging copy; the producer
    loads the newest verified one with ``load_newest`` at its own pace."""

    def __init__(self, rank: int, num_producers: int, locate: Callable[[Callable[[], bool]], tuple[str, int] | None],
                 timeout_s: float):
        """``locate(stopping)``: the sender's store (host, port), waiting until it exists or ``stopping()`` (then
        None); called in the thread."""
        self.rank, self.num_producers, self.timeout_s = rank, num_producers, timeout_s
        self._locate = locate
        self.staging_lock = threading.Lock()  # held while receiving into, or loading from, the staging copy
        self._cond = threading.Condition()
        self._staged = 0  # the verified version in the staging copy (0: none)
        self._slots: list[Slot] = []
        self._staging: list[torch.Tensor] = []
        self._layout: str | None = None
        self._stop = False
        self._state = "looking for the sender"  # what the thread does now
        self._failure: str | None = None  # why the last version was discarded
        self.generation = 0
        self.incarnation = 0
        self._thread = threading.Thread(target=self._serve, name="weight-sync-receiver", daemon=True)
        self._thread.start()

    @property
    def staged_version(self) -> int:
        return self._staged

    def load_newest(self, load: Callable[[Iterator[tuple[str, torch.Tensor]]], None], current: int,
                    min_version: int | None = None, timeout_s: float | None = None) -> int:
        """Load the newest verified version into the model with ``load`` if it is newer than ``current``;
        with ``min_version``, first wait until one at least that new has arrived. Returns the version held."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if min_version is not None:
            deadline = time.monotonic() + timeout_s
            with self._cond:
                while self._staged < min_version and current < min_version:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._thread.is_alive():
                        raise TimeoutError(
                            f"weight sync: producer {self.rank} did not receive version {min_version} within "
                            f"{timeout_s:g} s (it holds version {max(current, self._staged)}; "
                            f"{'; '.join(filter(None, (self._failure, self._state)))})")
                    self._cond.wait(min(remaining, 1.0))
        with self.staging_lock:
            if self._staged > current:
                load(tensor_views(self._staging, self._slots))
                return self._staged
        return current

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)

    def _stopping(self) -> bool:
        return self._stop

    # --- the thread ---
    def _serve(self) -> None:
        try:
            self._serve_until_done()
        except Exception as err:  # load_newest reports it when a producer waits for weights
            self._state = f"the receiver failed: {type(err).__name__}: {err}"

    def _serve_until_done(self) -> None:
        located = self._locate(self._stopping)
        if located is None:
            return
        host, port = located
        self.store = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=self.timeout_s))
        self.backend = self.store.get("backend").decode()
        if self.backend == "nccl" and not torch.cuda.is_available():
            self._state = "the sender uses nccl but this producer has no CUDA device"
            return
        generation = self._register()
        while generation is not None and not self._stop:
            try:
                generation = self._run_generation(generation)
            except Exception as err:  # the group broke (a peer died): join again under a new incarnation
                self._state = f"re-joining after a failed transfer ({type(err).__name__})"
                generation = self._register()

    def _register(self) -> int | None:
        self.incarnation = self.store.add(f"member/{self.rank}", 1)
        self._state = f"waiting to be admitted to a group (incarnation {self.incarnation})"
        key = f"joined/{self.rank}/{self.incarnation}"
        if not wait_key(self.store, key, self._stopping):
            return None
        return int(self.store.get(key).decode())

    def _run_generation(self, generation: int) -> int | None:
        """Join ``generation`` and receive syncs until told to move (returns the next generation) or to stop."""
        self.generation = generation
        prefix = f"g{generation}/"
        self.store.set(f"{prefix}here/{self.rank}", str(self.incarnation))
        self._state = f"waiting for generation {generation} to start"
        started = False
        n = 0
        while not self._stop:
            if not started:  # the sender starts the group once all are here, or moves everyone on
                if self.store.check([f"{prefix}msg/0"]) and not self.store.check([f"{prefix}start"]):
                    message = self.store.get(f"{prefix}msg/0").decode()
                    if message.startswith("reform"):
                        return int(message.split()[1])
                if not self.store.check([f"{prefix}start"]):
                    time.sleep(POLL_MAX_S / 5)
                    continue
                group = make_group(self.store, generation, self.rank + 1, self.num_producers + 1, self.backend,
                                    self.timeout_s)
                started = True
            self._state = f"idle in generation {generation}"
            if not wait_key(self.store, f"{prefix}msg/{n}", self._stopping):
                return None
            message = self.store.get(f"{prefix}msg/{n}").decode().split()
            if message[0] == "close":
                return None
            if message[0] == "reform":
                return int(message[1])
            version, layout = int(message[1]), message[2]
            with self.staging_lock:
                self._prepare(layout)
                self.store.set(f"{prefix}ready/{n}/{self.rank}", "1")
                self._state = f"ready for version {version}"
                if not wait_key(self.store, f"{prefix}go/{n}", self._stopping):
                    return None
                go = self.store.get(f"{prefix}go/{n}").decode().split()
                if go[0] == "reform":
                    return int(go[1])
                self._receive(group, version)
            n += 1
        return None

    def _prepare(self, layout: str) -> None:
        if layout == self._layout:
            return
        spec = json.loads(self.store.get(f"layout/{layout}").decode())
        self._slots = [Slot(name, dtype, tuple(shape), bucket, offset, nbytes)
                       for name, dtype, shape, bucket, offset, nbytes in spec["slots"]]
        self._staging = [torch.empty(size, dtype=torch.uint8) for size in spec["sizes"]]
        self._layout, self._staged = layout, 0

    def _receive(self, group, version: int) -> None:
        """Called with the staging lock held: every bucket, then the checksum table."""
        self._state = f"receiving version {version}"
        with self._cond:
            self._staged = 0  # the staging copy is being overwritten
        device = group_device(self.backend)
        sums = []

        def start(index):  # on CPU straight into the staging copy
            staging = self._staging[index]
            bucket = staging if device.type == "cpu" else torch.empty_like(staging, device=device)
            return broadcast(group, bucket), bucket

        for index, bucket in pipelined(self._staging, start):
            self._received(index, bucket)
            sums.append(checksum(bucket))
            if bucket is not self._staging[index]:
                self._staging[index].copy_(bucket)
        table = torch.zeros(self.num_producers + 1, len(self._staging), dtype=torch.int64, device=device)
        table[self.rank + 1] = torch.tensor(sums, dtype=torch.int64)
        allreduce(group, table)
        bad = mismatches(table.cpu())
        if bad:  # all or nothing: no producer generates with a version the sender reports as failed
            self._failure = f"discarded version {version}: producer {bad[0][0] - 1}'s checksums differ from the sender's"
            return
        self._failure = None
        with self._cond:
            self._staged = version
            self._cond.notify_all()
        self._state = f"holding version {version}"

    def _received(self, index: int, bucket: torch.Tensor) -> None:
        """Hook after a bucket arrived (tests inject corruption here)."""
