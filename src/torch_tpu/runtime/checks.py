"""Value checks XLA cannot raise (index bounds, division by zero), reported where they belong.

An XLA program cannot raise: it clamps an out-of-range index and carries on. So an op whose
inputs PyTorch validates by value computes a small check result next to its output, and a
callback turns the host copy of that result into PyTorch's exception. In strict eager the check
runs at once (one host sync). In fused eager and in compiled programs the result is computed
with the graph, like a CUDA device-side assert, and reported later -- but never at an unrelated
op:

- a host read (``.item()``, ``.cpu()``, printing, an op whose output shape depends on data) of
  a value reports the checks that value depends on, and raises there: every array a graph
  computes is *tainted* by the graph's checks and by those of its inputs, until they pass;
- ``torch.tpu.synchronize()`` and the end of ``backward()`` report every check of this thread;
- a check that failed keeps failing every read of the values it taints (they are wrong).

Checks belong to the thread whose ops recorded them; another thread is affected only if it
reads a value computed from theirs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from . import events
from .buffer import Deferred, resolved
from .context import context
from .events import user_line

_PENDING, _PASSED, _FAILED = range(3)


class Check:
    """One deferred check: its result arrays, the callback that raises PyTorch's exception from
    their host values, and the op and source line it came from."""

    __slots__ = ("values", "callback", "origin", "flags", "state", "error", "reported")

    def __init__(self, values: Any, callback: Callable[[Any], None], origin: str, flags: list | None = None):
        self.values, self.callback, self.origin = values, callback, origin
        #: leaves of ``values`` (boolean scalars) that are all False when the check passes, so a
        #: program computing several checks can sum them up in one flag (:class:`Summary`);
        #: None where the callback alone can tell
        self.flags = flags
        self.state = _PENDING
        self.error: BaseException | None = None
        self.reported = False

    def ready(self) -> bool:
        leaves = jax.tree_util.tree_leaves(self.values if self.flags is None else self.flags)
        if not all(type(v) is not Deferred or v.value is not None for v in leaves):
            return False
        arrays = (resolved(v) for v in leaves)  # (host values, ``host_copies.host_copy``'s, are)
        return all(a.is_ready() for a in arrays if isinstance(a, jax.Array))

    def settle(self) -> int:
        """Run the callback on the results (waiting for them); remember how it went."""
        settle_together((self,))
        return self.state

    def arrays(self) -> Any:
        """The result arrays (the pytree of ``values``, each computed)."""
        return jax.tree_util.tree_map(resolved, self.values)

    def first_read(self) -> Any:
        """What settling reads first: the flags where the check has them, else its results."""
        return self.arrays() if self.flags is None else [resolved(f) for f in self.flags]

    def conclude_first(self, host_values: Any) -> None:
        """Conclude from the host values of :meth:`first_read`: flags all clear pass without
        reading the results; otherwise the results are read and the callback runs."""
        if self.flags is not None:
            if not any(np.any(f) for f in host_values):
                self.state = _PASSED
                self.values = self.callback = self.flags = None
                return
            host_values = jax.device_get(self.arrays())
        self.conclude(host_values)

    def conclude(self, host_values: Any) -> None:
        """Run the callback on the results' host copies; remember how it went."""
        try:
            self.callback(host_values)
            self.state = _PASSED
        except Exception as error:  # noqa: BLE001  (kept, raised where the value is read)
            self.error, self.state = error, _FAILED
        self.values = self.callback = self.flags = None  # (nor keep what the callback refers to alive)

    def exception(self, where: str) -> BaseException:
        """The check's exception, saying where it came from and where it is reported."""
        error = self.error
        message = (
            f"{error} (raised by {self.origin}; reported {where}: a value check runs "
            "with the graph that computes it and is reported when a value depending on "
            "it is read or at synchronize(); set TPU_LAUNCH_BLOCKING=1 to raise it at "
            "the op)"
        )
        try:
            raised = type(error)(message)
        except Exception:  # noqa: BLE001  (an exception type with another signature)
            raised = RuntimeError(message)
        raised.__cause__ = error
        return raised


class Summary(Check):
    """The checks of one program run, summed up by the program in one boolean (True where any of
    their flags is set): settled by reading that one value, and each member's results only
    where it is set (a serving step's several bounds checks cost one small read, not several).
    A failure is the first failing member's, from where it came."""

    __slots__ = ("members",)

    def __init__(self, flag: Any, members: Callable[[], list[Check]], origin: str):
        super().__init__(flag, None, origin)
        self.members = members

    def conclude(self, host_values: Any) -> None:
        self.state = _PASSED
        if host_values:
            for member in self.members():
                if member.settle() == _FAILED:
                    self.error, self.origin, self.state = member.error, member.origin, _FAILED
                    break
        self.values = self.members = None


#: Called before the host waits on the device (a tensor read, a check's result,
#: ``synchronize()``): ``tpu_dist``'s watchdog, which raises there when a collective failed or
#: outlived its group's timeout, where the read would wait for it forever.
before_wait: list[Callable[[], None]] = []


def before_host_wait() -> None:
    for hook in before_wait:
        hook()


def settle_together(checks: Iterable[Check]) -> None:
    """Settle the pending ``checks`` with one device read for all their results (a read per
    check costs a round trip each: a serving step reports several)."""
    pending = [c for c in checks if c.state == _PENDING]
    if pending:
        if before_wait:
            before_host_wait()
        if events.listeners:
            events.tell("sync", "value check")
        for check, host_values in zip(pending, jax.device_get([c.first_read() for c in pending])):
            check.conclude_first(host_values)


# ----------------------------------------------------------------------------- recording checks
def when_ready(values: Any, callback: Callable[[Any], None], flags: list | None = None) -> None:
    """Call ``callback`` with the host copy of ``values`` (a pytree of result arrays): now in
    strict eager; while a fused graph records, with that graph (reported as the module
    docstring says), even if ``values`` are computed already. An exception from ``callback`` is
    PyTorch's error for the op. ``flags``: see :attr:`Check.flags`."""
    leaves = jax.tree_util.tree_leaves(values)
    pending = [v for v in leaves if type(v) is Deferred and v.value is None]
    if pending:
        graph = pending[0].graph
    elif not any(isinstance(v, (jax.Array, Deferred)) for v in leaves):
        # computed on the host (``host_copies.host_copy``): settled now; while a graph records, a
        # check that passed has nothing to report (none kept, nothing tainted), one that failed
        # is reported with the graph, as if the graph had computed it
        try:
            callback(values)
            return
        except Exception:
            if context.recorder is None or context.trace is not None:
                raise
            graph = context.recorder.open_graph()
    elif context.recorder is not None and context.trace is None:
        # computed at once from inputs that were ready (``apply_check``), reported as if the
        # graph had computed it: with the outputs of the op being recorded
        graph = context.recorder.open_graph()
    else:
        if before_wait:
            before_host_wait()
        if events.listeners:
            events.tell("sync", "value check")
        callback(jax.device_get(jax.tree_util.tree_map(resolved, values)))
        return
    graph.add_check(Check(values, callback, f"{context.op or 'an op'} at {user_line()}", flags))


def deferred(values: Any, callback: Callable[[Any], None], origin: str) -> Check:
    """A check whose results a compiled program has just computed: queued for this thread, to
    taint the program's outputs (:func:`taint`)."""
    check = Check(values, callback, origin)
    queue(check)
    return check


_lock = threading.Lock()  # the taint table and the unreported lists

#: Past this many unreported checks, the oldest are settled (waiting if needed), so memory stays
#: bounded in a loop that never reads a value; a failure is kept for the read that needs it.
max_unreported = 64


def queue(check: Check, pending: list | None = None) -> None:
    """Hand a check whose results are being computed to the unreported list of a thread (the
    one that recorded it; by default this one)."""
    pending = context.checks if pending is None else pending
    with _lock:
        pending.append(check)
    if len(pending) > max_unreported:
        _prune(pending, block=True)


def _prune(pending: list, block: bool) -> None:
    """Settle what is ready (the oldest half in any case when ``block``); forget the checks
    that passed."""
    limit = len(pending) // 2 if block else 0
    settle_together(
        c for i, c in enumerate(list(pending)) if (block and i < limit) or (c.state == _PENDING and c.ready())
    )
    with _lock:
        pending[:] = [c for c in pending if c.state != _PASSED]


# ----------------------------------------------------------------------------- taint
#: id(array) -> (weak reference to it, the checks its value depends on)
_taints: dict[int, tuple[weakref.ref, tuple[Check, ...]]] = {}


def taint_of(array: Any) -> tuple[Check, ...]:
    """The unsettled or failed checks ``array``'s value depends on."""
    entry = _taints.get(id(array))
    if entry is None or entry[0]() is not array:
        return ()
    return tuple(c for c in entry[1] if c.state != _PASSED)


def inherited(arrays: Iterable[Any]) -> set[Check]:
    """The checks any of ``arrays`` depends on (a graph's inputs: its outputs inherit them)."""
    found: set[Check] = set()
    if _taints:
        for array in arrays:
            found.update(taint_of(array))
    return found


def taint(arrays: Iterable[Any], checks: Iterable[Check]) -> None:
    """Make every read of ``arrays`` report ``checks`` first."""
    checks = tuple(c for c in checks if c.state != _PASSED)
    if not checks:
        return
    with _lock:
        if len(_taints) > _sweep_at:
            _sweep()
        for array in arrays:
            _taints[id(array)] = (weakref.ref(array), checks)


#: the taint table's size that triggers the next sweep
_sweep_at = 4096


def _sweep() -> None:
    """Forget dead arrays and checks that passed (called under the lock as the table grows)."""
    global _sweep_at
    for key, (ref, checks) in list(_taints.items()):
        if ref() is None or all(c.state == _PASSED for c in checks):
            del _taints[key]
    _sweep_at = max(4096, 4 * len(_taints))


# ----------------------------------------------------------------------------- reporting
def report(checks: Iterable[Check], where: str = "at a read of a value depending on it") -> None:
    """Settle ``checks`` (waiting for their results) and raise the first failure."""
    checks = tuple(checks)
    settle_together(checks)
    for check in checks:
        if check.settle() == _FAILED:
            check.reported = True
            raise check.exception(where)


def before_host_read(value: Any) -> jax.Array:
    """The array of ``value`` for a host read: its graph has run and every check it depends on
    has passed (else that check's exception is raised here)."""
    array = resolved(value)
    if _taints:
        report(taint_of(array))
    if before_wait:
        before_host_wait()
    return array


def report_all(where: str = "at synchronize()") -> None:
    """Report every check of this thread (``synchronize()``, the end of ``backward()``); a
    failure already raised at a read is not raised again."""
    pending = context.checks
    try:
        settle_together(pending)
        for check in pending:
            if check.settle() == _FAILED and not check.reported:
                check.reported = True
                raise check.exception(where)
    finally:
        with _lock:
            pending[:] = [c for c in pending if c.state == _PENDING]


def poll() -> None:
    """Settle the checks whose results are ready, without waiting (after a graph is launched)."""
    if context.checks:
        _prune(context.checks, block=False)
