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
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
import tempfile
import threading

import jax
from jax._src import compilation_cache as jax_compilation_cache
from jax._src.compilation_cache_interface import CacheInterface

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


def enable(directory: str, min_compile_seconds: float) -> None:
    """Persist compiled executables in ``directory`` through :class:`VerifiedFileCache`."""
    # JAX builds its cache backend in get_file_cache, lazily on the first compilation
    jax_compilation_cache.get_file_cache = lambda path: (VerifiedFileCache(path), path)
    if jax_compilation_cache._cache is not None:  # JAX compiled before torch_tpu was imported
        jax_compilation_cache.reset_cache()
    # the extra XLA caches put their absolute path (inside ``directory``) into every key
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
