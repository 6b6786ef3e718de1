"""The device and its values: the XLA platform (``platform``), the value behind a storage
(``buffer``), tpu tensors over those values (``tensor``), host transfers (``transfer``), the
default generator (``random``), per-thread execution state (``context``), deferred value checks
(``checks``), device memory and out-of-memory errors (``memory``), bounded caches (``lru``).

Importing this package imports no JAX; the modules that compute with it do, on first use.
"""
