"""What bounds a collective by its group's timeout when the ranks do not meet before it.

A collective's program is dispatched at once (the store meeting of ``handshake`` is the debug
mode, ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, as NCCL checks collectives only there). XLA's
collectives wait without limit for a rank that never comes, so, as NCCL's watchdog does, this
module keeps every collective in flight (:class:`Call`) with its deadline:

- a *waiter* thread waits for each call's result in order and marks it done (or records the
  error XLA raised: a peer that died resets gloo's connections);
- a *monitor* thread posts this rank's progress (how many collectives it entered, per set of
  members) on each group's store every fraction of the timeout, and marks a call that outlived
  its deadline as timed out, naming the members whose posted progress never reached it (they
  never called it) or who stopped posting (they died);
- the process's host reads (:func:`torch_tpu.runtime.checks.before_host_wait`) and every new
  collective first :meth:`Watchdog.settle` / :meth:`Watchdog.check`: a failure raises
  ``DistBackendError`` there, within the timeout, instead of a read that waits forever.

A failure leaves the XLA collective stuck or broken in this process, so every later collective
of the process raises too (a timed-out NCCL communicator is aborted likewise), and the process
skips JAX's exit-time shutdown, which would wait for the missing rank.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..runtime import checks
from . import programs

#: how often a rank posts its progress: a fraction of its group's timeout, at most this often
_MAX_INTERVAL = 1.0
_MIN_INTERVAL = 0.05


class Ledger:
    """The collectives one rank of a group entered, counted per set of members (a collective's
    sequence number), posted on the group's store for the others to read after a timeout."""

    def __init__(self, store, rank: int, timeout: float, describe: str) -> None:
        self.store, self.rank, self.timeout = store, rank, timeout
        self.describe = describe  # "group 'name' (ranks [...])", for messages
        self.interval = min(_MAX_INTERVAL, max(_MIN_INTERVAL, timeout / 8))
        self.entered: dict[tuple, int] = {}
        self._lock = threading.Lock()

    def enter(self, members: tuple) -> int:
        """The sequence number of this rank's next collective among ``members``."""
        with self._lock:
            sequence = self.entered.get(members, 0)
            self.entered[members] = sequence + 1
        return sequence

    def post(self) -> None:
        with self._lock:
            counts = {"-".join(map(str, m)): n for m, n in self.entered.items()}
        self.store.set(f"tpu_dist/progress/{self.rank}", json.dumps([time.time(), counts]))

    def absent(self, call: Call) -> tuple[list[int], list[int]]:
        """The members that never entered ``call`` (their last post counts fewer calls), and
        those whose posts stopped (died, or hang holding the interpreter)."""
        key = "-".join(map(str, call.members))
        never, silent, now = [], [], time.time()
        for r in call.members:
            if r == self.rank:
                continue
            name = f"tpu_dist/progress/{r}"
            if not self.store.check([name]):
                never.append(r)
                continue
            posted, counts = json.loads(self.store.get(name))
            if counts.get(key, 0) <= call.sequence:
                never.append(r)
            elif now - posted > 3 * self.interval:
                silent.append(r)
        return never, silent


@dataclasses.dataclass(eq=False)
class Call:
    """One collective in flight."""

    what: str  # "all_reduce"
    ledger: Ledger
    members: tuple  # the group ranks taking part
    sequence: int  # its number among the calls of ``members``
    result: Any  # an array the collective writes: ready once it completed
    deadline: float  # time.monotonic()
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def describe(self) -> str:
        return f"{self.what} on {self.ledger.describe} (rank {self.ledger.rank}, collective #{self.sequence})"


class Watchdog:
    """The owner of this process's collectives in flight and of their failure."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: collections.deque[Call] = collections.deque()
        self._ledgers: weakref.WeakSet[Ledger] = weakref.WeakSet()
        self.failure: str | None = None
        self.failed_timeout = 0.0  # (the failed call's group's)
        self._told = False  # (the failure was raised once: later calls say the process is unusable)
        self._threads: dict[str, threading.Thread] = {}
        self._programs: queue.SimpleQueue = queue.SimpleQueue()  # (program, future) to dispatch
        self._in_native = 0  # (watchdog threads now waiting inside XLA)
        self._stopping = threading.Event()  # (set at exit: the monitor stops posting)

    # -- the calling thread
    def add_ledger(self, ledger: Ledger) -> None:
        with self._cond:
            self._ledgers.add(ledger)
            self._start()

    def check(self) -> None:
        """Before a collective: raise if one failed (the process's collectives are unusable)
        or outlived its deadline."""
        calls = self._calls
        if calls and time.monotonic() > calls[0].deadline and not calls[0].done.is_set():
            self._time_out(calls[0])
        if self.failure is not None:
            told, self._told = self._told, True
            raise dist.DistBackendError(
                f"tpu_dist: collectives are unusable in this process after an earlier failure: {self.failure}"
                if told
                else f"tpu_dist: {self.failure}"
            )

    def dispatch(self, call: Call, program: Callable[[], Any]) -> Any:
        """Run ``program`` (it dispatches ``call``'s XLA program and returns its result) within
        the call's deadline; raise ``DistBackendError`` when it fails or outlives it.

        Where XLA runs collectives on the calling thread (:func:`programs.runs_inline`: the CPU
        stand-in), a collective waiting for a missing rank would hold this thread forever, so
        the program runs on the watchdog's dispatch thread while this one waits up to the
        deadline. Elsewhere the dispatch returns at once and the waiter thread watches the
        result."""
        if not programs.runs_inline():
            call.result = program()
            with self._cond:
                self._calls.append(call)
                self._cond.notify_all()
            return call.result
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._programs.put((program, future))
        try:
            call.result = future.result(timeout=max(0.0, call.deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            self._time_out(call)
        except Exception as e:  # noqa: BLE001  (XLA's error: a peer that died mid-collective...)
            self._program_failed(call, e)
        self.check()
        return call.result

    def settle(self) -> None:
        """Before a host read: wait for the collectives in flight, each up to its deadline;
        raise ``DistBackendError`` when one failed or outlived it. After a failure, reads
        raise while results of collectives remain stuck (reading one would wait forever), and
        else only the first time."""
        with self._cond:
            calls = list(self._calls)
        for call in calls:
            if self.failure is not None:
                break
            if not call.done.wait(max(0.0, call.deadline - time.monotonic())):
                self._time_out(call)
        if self.failure is not None and (not self._told or any(not c.done.is_set() for c in calls)):
            self.check()

    # -- failures
    def _fail(self, call: Call, message: str) -> None:
        with self._cond:
            if self.failure is None:
                self.failure, self.failed_timeout = message, call.ledger.timeout
                print(f"[torch_tpu] tpu_dist: {message}", file=sys.stderr, flush=True)
            self._cond.notify_all()

    def _time_out(self, call: Call) -> None:
        if call.done.is_set() or self.failure is not None:
            return
        never, silent = _absent(call)
        timeout = f"{call.ledger.timeout:g} s"
        if never:
            why = (
                f"{_ranks(never)} never joined it (the rank died, hangs, or runs a different "
                "sequence of collectives)"
            )
        elif silent:
            why = f"{_ranks(silent)} stopped responding (died or hangs)"
        else:
            why = (
                "every rank entered it, yet it did not complete (ranks that called it with "
                "different tensors: run with TORCH_DISTRIBUTED_DEBUG=DETAIL to check)"
            )
        self._fail(call, f"{call.describe()} timed out after {timeout}: {why}")

    def _program_failed(self, call: Call, error: Exception) -> None:
        never, silent = _absent(call, wait=True)
        who = f"; {_ranks(never + silent)} stopped responding" if never + silent else ""
        self._fail(call, f"{call.describe()} failed{who}: {error}")

    # -- the threads
    def _start(self) -> None:
        if self._threads:
            return
        for target in (self._wait_loop, self._monitor_loop, self._dispatch_loop):
            name = target.__name__.strip("_")
            self._threads[name] = threading.Thread(target=target, name=f"tpu_dist {name}", daemon=True)
            self._threads[name].start()
        atexit.register(_at_exit)
        checks.before_wait.append(self.settle)

    def _wait_loop(self) -> None:
        while True:
            with self._cond:
                while not self._calls:
                    self._cond.wait()
                call = self._calls[0]
            try:
                with self._native():
                    call.result.block_until_ready()
            except Exception as e:  # noqa: BLE001  (a peer that died mid-collective)
                self._program_failed(call, e)
                return  # (the process's collectives are unusable: nothing else to wait for)
            call.done.set()
            with self._cond:
                self._calls.popleft()

    @contextlib.contextmanager
    def _native(self):
        """Around a watchdog thread's wait inside XLA (counted: see :meth:`quiesce`)."""
        with self._cond:
            self._in_native += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_native -= 1
                self._cond.notify_all()

    def quiesce(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the watchdog's threads to be out of XLA (a stuck collective
        ends once its peers have exited: gloo's connections close); whether they are."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._in_native, seconds)

    def stop(self) -> None:
        """At exit: stop the monitor between two posts (a daemon thread inside a C++ call when
        the interpreter finalizes aborts the process) and let collectives in flight end."""
        self._stopping.set()
        self._threads["monitor_loop"].join(timeout=_MAX_INTERVAL + 5)
        with self._cond:
            deadlines = [call.deadline for call in self._calls]
        self.quiesce(max([d - time.monotonic() for d in deadlines], default=0.0))

    def _dispatch_loop(self) -> None:
        """(A daemon thread: a program stuck in a collective must not hold the process's exit.)"""
        while True:
            program, future = self._programs.get()
            try:
                with self._native():
                    result = program()
                future.set_result(result)
            except BaseException as e:  # noqa: BLE001
                future.set_exception(e)

    def _monitor_loop(self) -> None:
        while self.failure is None and not self._stopping.is_set():
            with self._cond:
                ledgers = list(self._ledgers)
                head = self._calls[0] if self._calls else None
            for ledger in ledgers:
                try:
                    ledger.post()
                except Exception:  # noqa: BLE001  (its store closed: the group was destroyed)
                    with self._cond:
                        self._ledgers.discard(ledger)
            if head is not None and not head.done.is_set() and time.monotonic() > head.deadline:
                self._time_out(head)
            self._stopping.wait(min((ledger.interval for ledger in ledgers), default=_MAX_INTERVAL))


def _absent(call: Call, wait: bool = False) -> tuple[list[int], list[int]]:
    """:meth:`Ledger.absent`, after the others' next posts when ``wait`` (a failed call: were
    they alive?); empty when the store cannot say."""
    if wait:
        time.sleep(4 * call.ledger.interval)
    try:
        return call.ledger.absent(call)
    except Exception:  # noqa: BLE001
        return [], []


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _at_exit() -> None:
    """At exit: stop the watchdog's threads (:meth:`Watchdog.stop`). After a failed collective,
    two things would hang or crash the exit: JAX's shutdown waits at a barrier for every
    process, forever for one that died; and a watchdog thread still inside a stuck XLA
    collective aborts the interpreter's finalization when the collective ends under it. Run the
    shutdown and let the stuck collective end (its peers exiting close its connections), for up
    to the failed group's timeout each; past that, end the process at once, with status 1."""
    watchdog.stop()
    if watchdog.failure is None:
        return
    from jax._src import distributed

    shutdown = threading.Thread(target=distributed.global_state.shutdown, daemon=True)
    shutdown.start()
    shutdown.join(watchdog.failed_timeout)
    if shutdown.is_alive() or not watchdog.quiesce(watchdog.failed_timeout):
        why = (
            "without JAX's shutdown, which waits for the ranks that are gone"
            if shutdown.is_alive()
            else "at once: a collective is still stuck"
        )
        print(f"[torch_tpu] tpu_dist: exiting {why}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)


#: this process's watchdog
watchdog = Watchdog()
