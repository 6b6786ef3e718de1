"""Storage for JAX's persistent compilation cache (``TORCH_TPU_CACHE_DIR``) that trusts an entry
only when it proves what it is.

JAX's own file cache (``jax._src.lru_cache.LRUCache``) returns whatever bytes a file named after
the key holds, and never overwrites a file that exists. So a truncated entry warned and was
recompiled in every process without ever being repaired, and an entry holding another key's
executable (two files swapped) ran that other program: wrong values, silently. Each entry here is

    MAGIC | key length (4 bytes, big-endian) | key | SHA-256 of the payload | payload

where the payload is what JAX hands us (its compressed executable and compile time). A read
checks the magic, the key and the checksum; an entry that fails, or cannot be read, is logged
once on the ``torch_tpu`` logger, deleted and reported as a miss, so JAX compiles the program
and writes a good entry that the next process hits. Writes go to a temporary file that is then
renamed over the entry, so a reader in another process never sees half an entry.

Nothing in a key depends on where the directory is: JAX would hash the path of its XLA GPU
autotuning cache (a folder inside the cache directory) into every key, so those extra XLA caches
are turned off and a copied or moved directory still hits.

Processes sharing the directory (the ranks of a job, on one host or over a shared file
system) compile each program once (:class:`Claims`): on a miss, a process claims the key (a
``<key>.compiling`` file made exclusively) and compiles; another that misses the same key waits
for the entry instead of compiling it too, up to ``TORCH_TPU_CACHE_WAIT_SECONDS``. A claim whose
process is gone (same host), or older than that, is taken over; a compile that fails or is not
written releases its claim, and a waiter then compiles.

Loading entries never takes the process past the kernel's limit on memory mappings
(``vm.max_map_count``), where XLA:CPU segfaults inside ``deserialize_executable``. XLA:CPU maps
about three regions per object file (one per kernel) of an executable it loads: a fused graph of
fifty kernels takes ~150, where :mod:`.executable_budget`, which reads the mapping count once
every 256 executables, expects ~3. On a warm cache a process loads such graphs back to back and
could overrun the limit between two of its readings. So each executable read from the cache (or
written after a compile, and each compiled graph :mod:`torch_tpu.frontends.compile.stored`
loads) counts its object files' mappings (:class:`MappingWatch`), the mapping count is read again
after every so many of those, and past the budget the in-memory caches are trimmed before the
next op, as :mod:`.executable_budget` does.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import pathlib
import socket
import tempfile
import threading
import time

import jax
from jax._src import compilation_cache as jax_compilation_cache
from jax._src.compilation_cache_interface import CacheInterface

from . import executable_budget

_log = logging.getLogger("torch_tpu")

#: Identifies the format; a new layout gets a new magic (old entries then read as misses).
MAGIC = b"torch_tpu-xla-entry-v1\n"
#: Entry file names end in this, so JAX's own ``*-cache`` files (older torch_tpu versions
#: sharing the directory) are never read as ours.
SUFFIX = ".xla-entry"
_LENGTH_BYTES = 4
_DIGEST_BYTES = hashlib.sha256().digest_size


_bypass = threading.local()


@contextlib.contextmanager
def reads_bypassed():
    """In this thread, compile anew even when the cache holds the executable: one loaded from
    the cache cannot be serialized again (XLA:CPU keeps no object code for it), and
    :mod:`torch_tpu.frontends.compile.stored` needs one it can store."""
    _bypass.on = True
    try:
        yield
    finally:
        _bypass.on = False


class InvalidEntry(ValueError):
    """A cache file that is not a well-formed, intact entry for the key it was read under."""


def pack(key: str, payload: bytes) -> bytes:
    """The bytes stored for ``payload`` under ``key``."""
    encoded = key.encode()
    return b"".join(
        (
            MAGIC,
            len(encoded).to_bytes(_LENGTH_BYTES, "big"),
            encoded,
            hashlib.sha256(payload).digest(),
            payload,
        )
    )


def unpack(key: str, entry: bytes) -> bytes:
    """The payload of ``entry``, after checking it is an intact entry for ``key``; raises
    :class:`InvalidEntry` saying what is wrong otherwise."""
    if not entry.startswith(MAGIC):
        raise InvalidEntry("not a torch_tpu cache entry (bad header)")
    key_start = len(MAGIC) + _LENGTH_BYTES
    digest_start = key_start + int.from_bytes(entry[len(MAGIC) : key_start], "big")
    payload_start = digest_start + _DIGEST_BYTES
    if len(entry) < payload_start:
        raise InvalidEntry("truncated")
    stored_key = entry[key_start:digest_start]
    if stored_key != key.encode():
        raise InvalidEntry(f"it holds the entry for another key ({stored_key.decode(errors='replace')!r})")
    payload = entry[payload_start:]
    if hashlib.sha256(payload).digest() != entry[digest_start:payload_start]:
        raise InvalidEntry("its checksum does not match (truncated or corrupted)")
    return payload


#: Memory mappings XLA:CPU makes for each object file of an executable it loads or compiles (its
#: code, read-only data and data), measured on XLA:CPU (jaxlib 0.10).
MAPPINGS_PER_OBJECT = 3
_OBJECT_FILE_MAGIC = b"\x7fELF"


def mappings_to_load(executable: bytes) -> int:
    """The memory mappings that loading ``executable`` (a serialized XLA:CPU executable, or bytes
    holding one) takes: XLA:CPU links each of its object files into memory on its own. 0 where
    the format holds no ELF object files; only :mod:`.executable_budget`'s own counts apply then."""
    return MAPPINGS_PER_OBJECT * executable.count(_OBJECT_FILE_MAGIC)


class MappingWatch:
    """Reads this process's memory-mapping count (``/proc/self/maps``: milliseconds, more the
    more mappings there are) after every so many mappings the executables loaded take, instead
    of after every so many executables: after a sixteenth of the limit (4,096 of 65,530), fewer
    the closer the count is to the limit. What the executables map between two readings is
    then never more than that, however many kernels each has."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since_reading = 0  # mappings the executables loaded since the last reading take
        self._allowance = 0  # read the count again once they reach this (0: at the first load)

    def loading(self, mappings: int) -> None:
        """Count ``mappings`` about to be mapped (or just mapped); past the budget, ask for a trim
        of the in-memory caches before the next op (``executable_budget.request_trim``)."""
        limit = executable_budget.limit
        if limit is None or mappings == 0:
            return
        with self._lock:
            self._since_reading += mappings
            if self._since_reading < self._allowance:
                return
            count = executable_budget.mapping_count() + mappings
            self._since_reading = 0
            self._allowance = min(limit // 16, (limit - count) // 8)
        if count > executable_budget.BUDGET * limit:
            executable_budget.request_trim()
        if count >= limit:  # (too late to trim: XLA is about to fail to map the code and crash)
            _log.error(
                "this process is about to exceed the kernel's limit of %d memory mappings "
                "(vm.max_map_count) loading an executable (%d mappings after it): XLA cannot map "
                "its code and may crash; raise vm.max_map_count or run fewer programs per process",
                limit,
                count,
            )


#: The watch over every executable this process loads from a cache or compiles.
mapping_watch = MappingWatch()


def note_executable(executable: bytes) -> None:
    """Count the mappings of ``executable`` (serialized), which this process is about to load (or
    has just compiled), toward the next reading of the mapping count (:class:`MappingWatch`)."""
    mapping_watch.loading(mappings_to_load(executable))


class VerifiedFileCache(CacheInterface):
    """One file per key in a directory; see the module docstring for the format and checks."""

    def __init__(self, path: str) -> None:
        self._path = pathlib.Path(path)
        self._path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: str) -> pathlib.Path:
        return self._path / f"{key}{SUFFIX}"

    def get(self, key: str) -> bytes | None:
        if getattr(_bypass, "on", False):
            return None
        file = self._file(key)
        try:
            return unpack(key, file.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, InvalidEntry) as error:
            _log.warning(
                "compilation cache entry %s is unusable (%s): deleted, it will be compiled and written again",
                file,
                error,
            )
            with contextlib.suppress(OSError):  # a read-only directory: still a miss
                file.unlink(missing_ok=True)
            return None

    def put(self, key: str, value: bytes) -> None:
        descriptor, temporary = tempfile.mkstemp(dir=self._path, prefix=".writing-")
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(pack(key, value))
            os.replace(temporary, self._file(key))
        except BaseException:
            os.unlink(temporary)
            raise


class Claims:
    """Which process compiles a key now: the ``<key>.compiling`` files of a cache directory, each
    ``host pid`` of the process compiling it. This thread's claims are released when its compile
    ends (:func:`released_after`), whether or not JAX wrote the entry."""

    SUFFIX = ".compiling"
    #: how often a waiting process looks for the entry (seconds)
    POLL = 0.02

    def __init__(self, path: pathlib.Path, wait_seconds: float) -> None:
        self._path, self.wait_seconds = path, wait_seconds
        self._host = socket.gethostname()
        self._held = threading.local()

    def _file(self, key: str) -> pathlib.Path:
        return self._path / f"{key}{self.SUFFIX}"

    def held(self) -> set[str]:
        if not hasattr(self._held, "keys"):
            self._held.keys = set()
        return self._held.keys

    def take(self, key: str) -> bool:
        """Claim ``key`` for this process; False where another process holds it."""
        try:
            descriptor = os.open(self._file(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as f:
            f.write(f"{self._host} {os.getpid()}")
        self.held().add(key)
        return True

    def release(self, key: str) -> None:
        if key in self.held():
            self.held().discard(key)
            with contextlib.suppress(OSError):
                self._file(key).unlink()

    def release_all(self) -> None:
        for key in list(self.held()):
            self.release(key)

    def holder_gone(self, key: str) -> bool | None:
        """Whether the claim on ``key`` is stale (its process is gone from this host, or it is
        older than the wait); None where there is no claim."""
        file = self._file(key)
        try:
            host, pid = file.read_text().split()
            age = time.time() - file.stat().st_mtime
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # (being written: not stale yet)
            return False
        return age > self.wait_seconds or (host == self._host and not _alive(int(pid)))

    def drop(self, key: str) -> None:
        """Remove another process's stale claim."""
        with contextlib.suppress(OSError):
            self._file(key).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process: alive)
        return True
    return True


class ExecutableCache(VerifiedFileCache):
    """JAX's persistent cache: a :class:`VerifiedFileCache` of JAX's payloads (an executable,
    compressed, and its compile time). JAX loads each entry read right after, and writes each one
    right after compiling it: the mappings of both count (:func:`note_executable`)."""

    def __init__(self, path: str, wait_seconds: float = 0.0) -> None:
        super().__init__(path)
        #: the compiles in progress, where processes share them (None: each compiles its own)
        self.claims = Claims(self._path, wait_seconds) if wait_seconds > 0 else None

    def get(self, key: str) -> bytes | None:
        payload = super().get(key)
        if payload is None and self.claims is not None and not getattr(_bypass, "on", False):
            payload = self._compiled_elsewhere(key)
        if payload is not None:
            note_executable(jax_compilation_cache.decompress_executable(payload))
        return payload

    def _compiled_elsewhere(self, key: str) -> bytes | None:
        """The entry another process is compiling, once it is written; None, with the key
        claimed by this process, where this one is to compile it."""
        claims = self.claims
        while not claims.take(key):
            stale = claims.holder_gone(key)
            if stale:
                claims.drop(key)
                continue
            if stale is None:  # (released between the two looks: the entry may be there now)
                payload = super().get(key)
                if payload is not None:
                    return payload
                continue
            time.sleep(Claims.POLL)
            payload = super().get(key)
            if payload is not None:
                return payload
        payload = super().get(key)  # (written just before this process claimed it)
        if payload is not None:
            claims.release(key)
        return payload

    def put(self, key: str, value: bytes) -> None:
        note_executable(jax_compilation_cache.decompress_executable(value))
        try:
            super().put(key, value)
        finally:
            if self.claims is not None:
                self.claims.release(key)


def _release_claims_after(compile_or_get_cached):
    """JAX's ``compile_or_get_cached``, releasing the claims its thread took when it ends (a
    compile that raised, or one JAX chose not to write, leaves none behind)."""

    @functools.wraps(compile_or_get_cached)
    def compiled(*args, **kwargs):
        try:
            return compile_or_get_cached(*args, **kwargs)
        finally:
            cache = jax_compilation_cache._cache
            if isinstance(cache, ExecutableCache) and cache.claims is not None:
                cache.claims.release_all()

    compiled.releases_claims = True
    return compiled


def enable(directory: str, min_compile_seconds: float, wait_seconds: float = 0.0) -> None:
    """Persist compiled executables in ``directory`` through :class:`ExecutableCache`; with
    ``wait_seconds``, processes sharing it compile each program once (:class:`Claims`)."""
    from jax._src import compiler

    # JAX builds its cache backend in get_file_cache, lazily on the first compilation
    jax_compilation_cache.get_file_cache = lambda path: (ExecutableCache(path, wait_seconds), path)
    if not getattr(compiler.compile_or_get_cached, "releases_claims", False):
        compiler.compile_or_get_cached = _release_claims_after(compiler.compile_or_get_cached)
    if jax_compilation_cache._cache is not None:  # JAX compiled before torch_tpu was imported
        jax_compilation_cache.reset_cache()
    # the extra XLA caches put their absolute path (inside ``directory``) into every key
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
