"""``python -m torch_tpu doctor``: what this install runs on, and whether it works.

The report (:class:`Report`) names the platform and its devices, the versions of torch_tpu and
what it runs with, whether the C++ runtime core (``torch_tpu._C``) is loaded, the persistent
compilation cache and its size, and the ``TORCH_TPU_*`` switches set in the environment; then a
self-test of a few seconds runs a handful of ops, one training step and one
``torch.compile(backend="tpu")`` on tpu and on CPU, and compares them. The last line is the
verdict, ``torch_tpu doctor: OK`` (exit code 0) or ``torch_tpu doctor: BROKEN (n problems)``
(exit code 1); ``--json`` prints the whole report as JSON instead.

Example::

    from torch_tpu import doctor

    report = doctor.build_report()
    print(doctor.render_text(report))
    assert report.ok, report.problems
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.machinery
import importlib.metadata
import inspect
import json
import os
import pathlib
import platform as _python_platform
import re
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping

import torch

from . import config
from .runtime import native, platform

#: Distributions whose versions are always reported.
REQUIRED = ("torch_tpu", "torch", "jax", "jaxlib")
#: Reported when installed (read from their metadata: none of them is imported).
OPTIONAL = ("libtpu", "transformers", "vllm")
#: How close tpu must come to CPU in the self-test: float32 with full-precision matmuls, but a
#: TPU's transcendental functions (softmax's exp) and reduction orders differ in the last bits.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


# ----------------------------------------------------------------------------- the records
@dataclasses.dataclass
class Platform:
    """The XLA platform behind "tpu" and its devices (``error``: why it did not start)."""

    device_name: str | None = None
    jax_backend: str | None = None
    #: JAX's local devices by kind, e.g. ``{"TPU v6 lite": 4}`` or ``{"cpu": 1}``
    device_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    #: ``torch.tpu.device_count()``: the devices this process drives
    torch_device_count: int = 0
    error: str | None = None


@dataclasses.dataclass
class Core:
    """The C++ runtime core: ``built`` (an extension file is in the package), ``loaded``."""

    built: bool
    loaded: bool
    path: str | None = None
    error: str | None = None


@dataclasses.dataclass
class Cache:
    """The persistent compilation cache (``directory`` None: turned off)."""

    directory: str | None
    files: int = 0
    megabytes: float = 0.0
    error: str | None = None


@dataclasses.dataclass
class Switch:
    """An environment switch that is set; ``known``: one that ``torch_tpu.config`` reads."""

    name: str
    value: str
    known: bool


@dataclasses.dataclass
class Check:
    """One self-test: passed or not, how long it took, and on failure the exception."""

    name: str
    passed: bool
    seconds: float
    error: str | None = None


@dataclasses.dataclass
class Report:
    platform: Platform
    versions: dict[str, str]
    core: Core
    cache: Cache
    switches: list[Switch]
    checks: list[Check]

    @property
    def problems(self) -> list[str]:
        """What is broken, one sentence each (empty when healthy)."""
        return [*_install_problems(self), *_check_problems(self.checks)]

    @property
    def ok(self) -> bool:
        return not self.problems

    def verdict(self) -> str:
        count = len(self.problems)
        if not count:
            return "torch_tpu doctor: OK"
        return f"torch_tpu doctor: BROKEN ({count} problem{'s' if count > 1 else ''})"

    def to_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "problems": self.problems,
            "ok": self.ok,
            "verdict": self.verdict(),
        }


def _install_problems(report: Report) -> list[str]:
    problems = []
    if report.platform.error:
        problems.append(f"the device did not start: {report.platform.error}")
    elif report.platform.torch_device_count < 1:
        problems.append("no tpu device: torch.tpu.device_count() is 0")
    if not report.core.loaded:
        remedy = "rebuild it for this torch" if report.core.built else "build it"
        problems.append(
            f"the C++ core (torch_tpu._C) is not loaded: {report.core.error}; "
            f"reinstall torch_tpu (pip install -e .) to {remedy}"
        )
    return problems


def _check_problems(checks: list[Check]) -> list[str]:
    return [
        f"self-test {check.name!r} failed: {_first_line(check.error)}" for check in checks if not check.passed
    ]


# ----------------------------------------------------------------------------- the sections
def platform_section() -> Platform:
    """Start the device (if it has not started) and describe it."""
    try:
        import jax

        torch_device_count = torch.tpu.device_count()
        kinds = Counter(device.device_kind for device in jax.local_devices())
        return Platform(
            device_name=torch.tpu.get_device_name(),
            jax_backend=jax.default_backend(),
            device_kinds=dict(kinds),
            torch_device_count=torch_device_count,
        )
    except Exception as error:  # a doctor reports what it finds
        return Platform(error=_describe(error))


def versions_section() -> dict[str, str]:
    """Python's version, then each distribution's (:data:`REQUIRED`, and :data:`OPTIONAL` ones
    that are installed)."""
    versions = {"python": _python_platform.python_version()}
    for name in REQUIRED + OPTIONAL:
        version = _installed_version(name)
        if version is not None or name in REQUIRED:
            versions[name] = version or "not installed"
    return versions


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def core_section() -> Core:
    """Whether the C++ runtime core is built (a ``_C`` extension beside this module) and loaded."""
    package = pathlib.Path(__file__).parent
    built = any((package / f"_C{suffix}").exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES)
    if native.available():
        return Core(built=built, loaded=True, path=native._C.__file__)
    return Core(built=built, loaded=False, error=str(native._error))


def cache_section() -> Cache:
    """The directory compiled executables persist in (the one JAX uses once the device started:
    ``TORCH_TPU_CACHE_DIR``, or the process's own choice) and what it holds."""
    directory = _cache_directory()
    if directory is None:
        return Cache(directory=None)
    try:
        files, size = _disk_usage(directory)
    except OSError as error:
        return Cache(directory=directory, error=_describe(error))
    return Cache(directory=directory, files=files, megabytes=round(size / 2**20, 1))


def _cache_directory() -> str | None:
    if platform.is_initialized():
        import jax

        return jax.config.jax_compilation_cache_dir or None
    return config.cache_dir


def _disk_usage(directory: str) -> tuple[int, int]:
    """(files, bytes) under ``directory`` (0, 0 when it does not exist yet)."""
    files = size = 0
    for root, _, names in os.walk(directory, onerror=_unless_missing):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(root, name)).st_size
    return files, size


def _unless_missing(error: OSError) -> None:
    if not isinstance(error, FileNotFoundError):
        raise error


def switches_section(environ: Mapping[str, str] = os.environ) -> list[Switch]:
    """The switches set in ``environ``: every ``TORCH_TPU_*`` name (an unknown one, likely a
    typo, is marked) and the other names ``torch_tpu.config`` reads (``TPU_LAUNCH_BLOCKING``)."""
    known = known_switches()
    names = sorted(name for name in environ if name.startswith("TORCH_TPU_") or name in (known or ()))
    return [Switch(name=name, value=environ[name], known=known is None or name in known) for name in names]


def known_switches() -> set[str] | None:
    """The environment names documented in ``torch_tpu.config`` (its ``#:`` comments); None
    where its source is not installed."""
    try:
        source = inspect.getsource(config)
    except OSError:
        return None
    return set(re.findall(r"``((?:TORCH_)?TPU_[A-Z0-9_]+)", source))


# ----------------------------------------------------------------------------- the self-test
def check_ops() -> None:
    """A matmul, a softmax, a reduction, indexing and a dtype cast: tpu against CPU."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=generator)
    w = torch.randn(32, 8, generator=generator)
    index = torch.tensor([3, 0, 7, 7, 15])
    ops: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "matmul": lambda x, w, i: x @ w,
        "softmax": lambda x, w, i: torch.softmax(x, dim=-1),
        "sum": lambda x, w, i: x.sum(dim=0),
        "indexing": lambda x, w, i: x[i, 2:10],
        "cast": lambda x, w, i: (x * 100).to(torch.int32),
    }
    for name, op in ops.items():
        _assert_same(name, op(x.to("tpu"), w.to("tpu"), index.to("tpu")), op(x, w, index))


def check_training() -> None:
    """One SGD step of a tiny MLP: the loss, the gradients and the updated weights match CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    on_tpu = _sgd_step(copy.deepcopy(model).to("tpu"), x.to("tpu"), y.to("tpu"))
    on_cpu = _sgd_step(model, x, y)
    for name, cpu_value in on_cpu.items():
        _assert_same(name, on_tpu[name], cpu_value)


def _sgd_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The loss, each parameter's gradient and each updated parameter after one step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    grads = {f"grad of {name}": p.grad.detach().clone() for name, p in model.named_parameters()}
    optimizer.step()
    updated = {f"updated {name}": p.detach() for name, p in model.named_parameters()}
    return {"loss": loss.detach(), **grads, **updated}


def check_compile() -> None:
    """``torch.compile(model, backend="tpu")`` on a small model matches the model on CPU. (The
    model is torch's own modules: Dynamo skips code in torch_tpu's runtime, this file included.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    x = torch.randn(8, 16)
    expected = model(x)
    compiled = torch.compile(model.to("tpu"), backend="tpu", fullgraph=True)
    _assert_same("compiled model", compiled(x.to("tpu")), expected)


def _assert_same(name: str, tpu_value: torch.Tensor, cpu_value: torch.Tensor) -> None:
    if tpu_value.device.type != "tpu":
        raise AssertionError(f"{name}: the result is on {tpu_value.device}, not on tpu")
    try:
        torch.testing.assert_close(tpu_value.cpu(), cpu_value, **TOLERANCE)
    except AssertionError as error:
        raise AssertionError(f"{name} differs from CPU: {error}") from None


#: The self-test, in order: (name, function raising on failure).
CHECKS: dict[str, Callable[[], None]] = {
    "ops": check_ops,
    "training": check_training,
    "compile": check_compile,
}


def run_check(name: str, check: Callable[[], None]) -> Check:
    start = time.perf_counter()
    try:
        check()
    except Exception as error:
        return Check(name, passed=False, seconds=time.perf_counter() - start, error=_describe(error))
    return Check(name, passed=True, seconds=time.perf_counter() - start)


def self_test() -> list[Check]:
    return [run_check(name, check) for name, check in CHECKS.items()]


def _describe(error: BaseException) -> str:
    return "".join(traceback.format_exception_only(error)).strip()


def _first_line(text: str | None) -> str:
    return text.splitlines()[0] if text else ""


# ----------------------------------------------------------------------------- the report
def build_report(*, run_self_test: bool = True) -> Report:
    """Every section, the cache measured before the self-test adds its programs to it (no
    self-test where the device did not start: its error is the one problem to report)."""
    device = platform_section()
    return Report(
        platform=device,
        versions=versions_section(),
        core=core_section(),
        cache=cache_section(),
        switches=switches_section(),
        checks=self_test() if run_self_test and not device.error else [],
    )


def render_text(report: Report) -> str:
    """The report as aligned text, ending with its verdict line."""
    sections = (
        ("Platform", _platform_rows(report.platform)),
        ("Versions", list(report.versions.items())),
        ("C++ core", _core_rows(report.core)),
        ("Persistent compilation cache", _cache_rows(report.cache)),
        ("Environment switches", _switch_rows(report.switches)),
        ("Self-test", _check_rows(report.checks)),
    )
    lines = []
    for title, rows in sections:
        lines += [title, *(f"  {label:<28}{value}".rstrip() for label, value in rows), ""]
    lines += [f"problem: {problem}" for problem in report.problems]
    return "\n".join([*lines, report.verdict()])


def _platform_rows(device: Platform) -> list[tuple[str, str]]:
    if device.error:
        return [("error", device.error)]
    kinds = ", ".join(f"{count} x {kind}" for kind, count in device.device_kinds.items())
    return [
        ("device", device.device_name or ""),
        ("jax backend", device.jax_backend or ""),
        ("jax devices", kinds),
        ("torch.tpu.device_count()", str(device.torch_device_count)),
    ]


def _core_rows(core: Core) -> list[tuple[str, str]]:
    if core.loaded:
        return [("loaded", f"yes ({core.path})")]
    return [("built", "yes" if core.built else "no"), ("loaded", f"NO ({core.error})")]


def _cache_rows(cache: Cache) -> list[tuple[str, str]]:
    if cache.directory is None:
        return [("directory", "off (TORCH_TPU_CACHE_DIR is empty or 0)")]
    size = cache.error or f"{cache.files} files, {cache.megabytes:.1f} MB"
    return [("directory", cache.directory), ("size", size)]


def _switch_rows(switches: list[Switch]) -> list[tuple[str, str]]:
    if not switches:
        return [("(none set)", "")]
    return [
        (s.name, s.value if s.known else f"{s.value}  (unknown: torch_tpu does not read it)")
        for s in switches
    ]


def _check_rows(checks: list[Check]) -> list[tuple[str, str]]:
    rows = []
    for check in checks:
        rows.append((check.name, f"{'pass' if check.passed else 'FAIL'}  {check.seconds:.2f} s"))
        rows += [("", line) for line in (check.error or "").splitlines()[:12]]
    return rows or [("(skipped)", "")]


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2)


# ----------------------------------------------------------------------------- the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    """Print the report; 0 when healthy, 1 otherwise."""
    report = build_report()
    print(render_json(report) if args.json else render_text(report))
    return 0 if report.ok else 1
