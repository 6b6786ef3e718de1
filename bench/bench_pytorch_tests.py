"""PyTorch's own device-generic tests on tpu against CPU: wall time, outcomes and XLA compiles.

Runs PyTorch's ``test/test_indexing.py`` and ``test/test_shape_ops.py`` (unmodified) under pytest,
once on CPU only and once on tpu only, each in a fresh process; the tpu run has the persistent
compile cache off (``TORCH_TPU_CACHE_DIR=0``), so every XLA compile is counted. The device is
chosen the way PyTorch's CI chooses it: ``instantiate_device_type_tests`` offers a
``PrivateUse1TestBase`` for the backend ``torch_tpu`` registers, and
``PYTORCH_TESTING_DEVICE_ONLY_FOR`` keeps one device. The CPU run has
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``: PyTorch alone. The issue's target: tpu wall time within 10x
CPU's.

This file is also the pytest plugin of both runs (``-p bench_pytorch_tests``): it imports
torch_tpu before the tests import PyTorch's testing helpers, bounds each test
(``--per-test-timeout``, a SIGALRM that fails the test), and writes one JSON line per test
(outcome, seconds, XLA compiles, the exception's first line) that the table is built from.

The test files are not part of this repository: pass the folder holding the two files of
PyTorch's ``test/`` (the matching release, v2.13.0 for torch 2.13) with ``--tests-dir`` or
``TORCH_TPU_PYTORCH_TESTS``. Nothing downloads.

Usage: ``python bench/bench_pytorch_tests.py --tests-dir DIR [--markdown] [--slowest N] [--results DIR]
[--per-test-timeout S] [--file-timeout S] [-k EXPR] [--include-large] [FILE ...]``; each run's
raw results stay in ``--results`` (one JSON line per test), and ``--report --results DIR`` prints
the tables again from them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time

import _docs

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("test_indexing.py", "test_shape_ops.py")
# allocates 2**31 + 5 and 2 * (2**31 + 5) int8 elements on the device (6 GiB and its copies)
LARGE = ("test_index_put_accumulate_large_tensor",)
_RESULT = "BENCH_PYTORCH_TESTS_RESULT"
_TIMEOUT = "BENCH_PYTORCH_TESTS_TIMEOUT"


# ----------------------------------------------------------------------------- the plugin (child side)
def _compiles() -> int | None:
    if "torch_tpu" not in sys.modules:
        return None
    import torch

    return torch.tpu.compilation_cache_stats()["xla_compiles"]


def _write(record: dict) -> None:
    with open(os.environ[_RESULT], "a") as out:
        out.write(json.dumps(record) + "\n")


class _Timeout(BaseException):
    """(not an Exception: the library's own fallbacks catch those)"""


def _on_alarm(signum, frame):
    raise _Timeout(f"test ran past {os.environ[_TIMEOUT]} s (--per-test-timeout)")


_STATE: dict = {}  # (the child's: the test running and what is known of it)


def pytest_configure(config):
    if _RESULT not in os.environ:
        return
    if os.environ.get("PYTORCH_TESTING_DEVICE_ONLY_FOR") != "cpu":
        # (before the tests import common_utils, whose NATIVE_DEVICES reads the backend's name)
        import torch_tpu  # noqa: F401
    _STATE.update(started=time.perf_counter(), compiles=_compiles())
    signal.signal(signal.SIGALRM, _on_alarm)


def pytest_runtest_logstart(nodeid, location):
    if _STATE:
        _write({"start": nodeid})
        _STATE["test"] = {
            "outcome": "passed",
            "seconds": 0.0,
            "message": "",
            "where": "",
            "compiles": _compiles(),
            "cpu": time.process_time(),
        }


def pytest_runtest_call(item):
    if _STATE:
        signal.setitimer(signal.ITIMER_REAL, float(os.environ[_TIMEOUT]), 10.0)  # (again every 10 s)


def pytest_runtest_makereport(item, call):
    if not _STATE:
        return
    if call.when == "call":
        signal.setitimer(signal.ITIMER_REAL, 0)
    record, excinfo = _STATE["test"], call.excinfo
    if excinfo is not None and not record["message"]:
        text = str(excinfo.value).strip().splitlines()
        record["message"] = f"{excinfo.typename}: {text[0] if text else ''}"[:300]
        here = [e for e in excinfo.traceback if str(e.path) == str(item.path)]
        if here:
            record["where"] = f"line {here[-1].lineno + 1}: {' '.join(str(here[-1].statement).split())}"[:200]


def pytest_runtest_logreport(report):
    if not _STATE:
        return
    record = _STATE["test"]
    record["seconds"] += report.duration
    if hasattr(report, "wasxfail"):
        record["outcome"] = "xfailed" if report.skipped else "xpassed"
    elif report.failed:
        record["outcome"] = "failed"
    elif report.skipped and record["outcome"] == "passed":
        record["outcome"] = "skipped"


def pytest_runtest_logfinish(nodeid, location):
    if _STATE:
        record, compiles = _STATE.pop("test"), _compiles()
        _write(
            {
                "test": nodeid,
                "outcome": record["outcome"],
                "seconds": record["seconds"],
                "cpu_seconds": time.process_time() - record["cpu"],
                "compiles": None if compiles is None else compiles - record["compiles"],
                "message": record["message"] if record["outcome"] == "failed" else "",
                "where": record["where"] if record["outcome"] == "failed" else "",
            }
        )


def pytest_sessionfinish(session, exitstatus):
    if _STATE:
        compiles = _compiles()
        _write(
            {
                "session_seconds": time.perf_counter() - _STATE["started"],
                "compiles": None if compiles is None else compiles - (_STATE["compiles"] or 0),
            }
        )


# ----------------------------------------------------------------------------- the runs (parent side)
def _run(tests_dir: str, name: str, device: str, options) -> None:
    """One pytest process over one file on one device; the plugin's lines, the output and the
    wall time land in ``options.results`` (kept, so a run cut short still tells what it did)."""
    stem = os.path.join(options.results, f"{name}.{device}")
    if os.path.exists(stem + ".jsonl"):
        os.unlink(stem + ".jsonl")
    env = dict(
        os.environ,
        PYTORCH_TESTING_DEVICE_ONLY_FOR=device,
        PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        **{_RESULT: stem + ".jsonl", _TIMEOUT: str(options.per_test_timeout)},
    )
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    else:
        env["TORCH_TPU_CACHE_DIR"] = "0"
    command = [sys.executable, "-m", "pytest", os.path.join(tests_dir, name), "-q", "--tb=no"]
    command += ["-p", "no:cacheprovider", "-p", "bench_pytorch_tests"]
    command += ["--rootdir", tests_dir, "--confcutdir", tests_dir]
    keyword = [f"({options.keyword})"] if options.keyword else []
    keyword += [] if options.include_large else [f"not {t}" for t in LARGE]
    if keyword:
        command += ["-k", " and ".join(keyword)]
    started, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(stem + ".log", "w") as log:
        try:
            code = subprocess.run(
                command,
                env=env,
                cwd=tests_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=options.file_timeout,
            ).returncode
            status = f"exit {code}"
        except subprocess.TimeoutExpired:
            status = f"killed after {options.file_timeout:.0f} s (--file-timeout)"
    wall, now = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    with open(stem + ".json", "w") as out:
        json.dump({"wall": wall, "cpu": cpu, "status": status}, out)


def _load(results: str, name: str, device: str) -> dict | None:
    stem = os.path.join(results, f"{name}.{device}")
    if not os.path.exists(stem + ".jsonl"):
        return None
    tests, started_last, session = {}, None, {}
    with open(stem + ".jsonl") as lines:
        for line in lines:
            record = json.loads(line)
            if "start" in record:
                started_last = record["start"]
            elif "test" in record:
                tests[record["test"]] = record
            else:
                session = record
    run = {"wall": None, "status": "did not finish", "tests": tests, "session": session}
    if os.path.exists(stem + ".json"):
        with open(stem + ".json") as info:
            run.update(json.load(info))
    run["crashed"] = started_last if started_last is not None and started_last not in tests else None
    return run


def _cpu_id(test: str, device: str) -> str:
    """The CPU twin of a tpu test's id: ``TestIndexingPRIVATEUSE1::test_x_tpu_float32`` ->
    ``TestIndexingCPU::test_x_cpu_float32``."""
    head, _, method = test.rpartition("::")
    head = re.sub(f"({device.upper()}|PRIVATEUSE1)$", "CPU", head)
    return f"{head}::{re.sub(f'_{device}(?=_|$)', '_cpu', method)}"


def _counts(run: dict) -> dict:
    counts: dict[str, int] = {}
    for record in run["tests"].values():
        counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
    return counts


def _cause(message: str) -> str:
    """A failure's group: the exception's first line with numbers written as N and dtype names
    as T (the dtype variants of one test fail alike)."""
    message = re.sub(r"\b(c10::\w+|u?int\d+_t|float|double|int|bool)\b(?= without)", "T", message)
    message = re.sub(
        r"\btorch\.(u?int|float|bfloat|complex|bool|half|double|long|short|cfloat|cdouble)\w*", "T", message
    )
    return re.sub(r"\b\d+(\.\d+)?\b", "N", message)


def _table(header: tuple, rows: list[tuple], markdown: bool) -> list[str]:
    if markdown:
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(str(c) for c in row) + " |" for row in rows
        ]
    return [" | ".join(header)] + [" | ".join(str(c) for c in row) for row in rows]


def _summary_row(name: str, cpu: dict, dev: dict) -> tuple:
    c, d = _counts(cpu), _counts(dev)
    wall = f"{dev['wall'] / cpu['wall']:.1f}x" if cpu["wall"] and dev["wall"] else ""
    used = ""
    if cpu.get("cpu") and dev.get("cpu"):
        used = f"{dev['cpu'] / cpu['cpu']:.1f}x ({cpu['cpu']:.0f} s, {dev['cpu']:.0f} s)"
    compiles = dev["session"].get("compiles", sum(r["compiles"] or 0 for r in dev["tests"].values()))
    return (
        name,
        f"{cpu['wall']:.1f}" if cpu["wall"] else cpu["status"],
        f"{dev['wall']:.1f}" if dev["wall"] else dev["status"],
        wall,
        used,
        compiles,
        "/".join(str(c.get(k, 0)) for k in ("passed", "failed", "skipped")),
        "/".join(str(d.get(k, 0)) for k in ("passed", "failed", "skipped")),
    )


def _slowest_rows(slow: list[tuple], count: int) -> list[tuple]:
    return [
        (
            test.split("::", 1)[-1],
            f"{record['seconds']:.2f}",
            f"{record['cpu_seconds']:.2f}" if "cpu_seconds" in record else "",
            f"{twin['seconds']:.3f}" if twin else "",
            record["compiles"],
            record["outcome"],
        )
        for _, test, record, twin in sorted(slow, key=lambda s: -s[0])[:count]
    ]


def _failure_rows(failures: dict[str, list]) -> list[tuple]:
    return [
        (
            len(tests),
            cause.replace("|", "\\|"),
            tests[0][0].split("::")[-1],
            tests[0][1]["where"].replace("|", "\\|"),
        )
        for cause, tests in sorted(failures.items(), key=lambda g: -len(g[1]))
    ]


def report(options) -> str:
    """The tables of the runs kept in ``options.results``: per file, the slowest tests, and the
    tpu failures grouped by cause; notes for runs that crashed or were killed."""
    device, rows, slow, failures, notes = options.device, [], [], {}, []
    for name in options.files:
        cpu, dev = _load(options.results, name, "cpu"), _load(options.results, name, device)
        if cpu is None or dev is None:
            missing = "no CPU run" if cpu is None else f"no {device} run"
            notes.append(f"{name}: {missing} in {options.results}")
            continue
        rows.append(_summary_row(name, cpu, dev))
        for run, where in ((cpu, "CPU"), (dev, device)):
            if run["crashed"] or run["status"] not in ("exit 0", "exit 1"):
                notes.append(f"{name} on {where}: {run['status']}; last test started: {run['crashed']}")
        for test, record in dev["tests"].items():
            slow.append((record["seconds"], test, record, cpu["tests"].get(_cpu_id(test, device), {})))
            if record["outcome"] == "failed":
                failures.setdefault(_cause(record["message"]), []).append((test, record))
    header = ("file", "CPU s", f"{device} s", "ratio", f"CPU-time ratio (CPU, {device})")
    header += (f"{device} XLA compiles", "CPU pass/fail/skip", f"{device} pass/fail/skip")
    lines = _table(header, rows, options.markdown)
    lines += ["", f"Slowest {options.slowest} {device} tests:", ""]
    header = ("test", f"{device} s", f"{device} CPU time s", "CPU s", f"{device} compiles", "outcome")
    lines += _table(header, _slowest_rows(slow, options.slowest), options.markdown)
    lines += ["", f"{device} failures by cause ({sum(len(g) for g in failures.values())} tests):", ""]
    lines += _table(("tests", "cause", "for example", "where"), _failure_rows(failures), options.markdown)
    return "\n".join(lines + ([""] + notes if notes else []))


def run_all(options) -> None:
    """Each file once on CPU and once on ``options.device``, each a fresh pytest process whose raw
    results land in ``options.results`` (a new temporary folder unless given)."""
    tests_dir = os.path.abspath(options.tests_dir)
    missing = [f for f in options.files if not os.path.isfile(os.path.join(tests_dir, f))]
    if missing:
        sys.exit(f"{', '.join(missing)} not in {tests_dir}: pass PyTorch's test/ folder with --tests-dir")
    options.results = options.results or tempfile.mkdtemp(prefix="bench_pytorch_tests_")
    os.makedirs(options.results, exist_ok=True)
    print(f"raw results: {options.results}", file=sys.stderr, flush=True)
    for name in options.files:
        _run(tests_dir, name, "cpu", options)
        _run(tests_dir, name, options.device, options)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=list(FILES), help="test files in --tests-dir")
    parser.add_argument(
        "--tests-dir",
        default=os.environ.get("TORCH_TPU_PYTORCH_TESTS", os.path.join(HERE, "vendor", "pytorch_tests")),
    )
    parser.add_argument("--markdown", action="store_true")
    _docs.add_flag(parser)
    parser.add_argument("--slowest", type=int, default=10, help="how many of the slowest tests to list")
    parser.add_argument("--per-test-timeout", type=float, default=1200.0, help="s; a test past it fails")
    parser.add_argument("--file-timeout", type=float, default=4 * 3600.0, help="s; a run past it is killed")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression, for a subset")
    parser.add_argument("--include-large", action="store_true", help=f"also run {', '.join(LARGE)}")
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--results", help="folder for each run's raw results (default: a new temporary one)")
    parser.add_argument("--report", action="store_true", help="only print the tables of --results")
    options = parser.parse_args()
    if options.report and not options.results:
        parser.error("--report needs --results")
    return options


def main() -> None:
    options = _arguments()
    if not options.report:
        run_all(options)
    with _docs.section("pytorch_tests", options):
        print(report(options))


if __name__ == "__main__":
    main()
