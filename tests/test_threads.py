"""Threads and processes: execution state is per thread (mode, fused graph, trace, checks), two
threads training at once each get their serial result, and a forked child that touches tpu
gets a clear error instead of hanging."""

from __future__ import annotations

import threading

import pytest
import torch

import torch_tpu


def _in_threads(*functions, timeout: float = 600):
    """Run each function in its own thread, all at once; re-raise the first error."""
    results, errors = [None] * len(functions), []

    def run(i, fn):
        try:
            results[i] = fn()
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(functions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]
    return results


def test_the_mode_belongs_to_the_thread():
    fused_now, checked = threading.Event(), threading.Event()

    def fused_thread():
        with torch_tpu.eager_mode("fused"):
            fused_now.set()
            checked.wait(60)
            return torch_tpu.get_eager_mode()

    def strict_thread():
        fused_now.wait(60)
        mode = torch_tpu.get_eager_mode()
        x = (torch.ones(3, device="tpu") * 2).sum()  # runs at once: nothing is recorded
        checked.set()
        return mode, torch_tpu.execution.pending_ops(), x.item()

    fused_mode, (strict_mode, pending, value) = _in_threads(fused_thread, strict_thread)
    assert fused_mode == "fused" and strict_mode == "strict" and pending == 0 and value == 6.0
    assert torch_tpu.get_eager_mode() == "strict"


_init_lock = threading.Lock()  # parameter init draws from torch's one global CPU generator


def _train(seed: int, steps: int = 6) -> list[float]:
    with _init_lock:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = model.to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 8, generator=generator).to("tpu")
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_two_threads_training_each_get_their_serial_result(mode):
    def in_mode(seed):
        def run():
            with torch_tpu.eager_mode(mode):
                return _train(seed)

        return run

    serial = [in_mode(1)(), in_mode(2)()]
    torch.tpu.reset_compilation_cache_stats()
    together = _in_threads(in_mode(1), in_mode(2))
    assert together == serial  # bit for bit: each thread ran exactly its own program
    if mode == "fused":  # and its own graphs: the serial run compiled them all already
        assert torch.tpu.compilation_cache_stats()["misses"] == 0


def test_one_threads_failed_check_is_never_raised_in_another():
    failed, valid_done = threading.Event(), threading.Event()

    def bad_thread():
        with torch_tpu.eager_mode("fused"):
            bad = torch.index_select(torch.arange(4, device="tpu"), 0, torch.tensor([9], device="tpu"))
            torch_tpu.execution.fused.flush("test")  # its graph has run, the check failed
            failed.set()
            valid_done.wait(60)
            with pytest.raises(IndexError, match="index out of range"):
                bad.tolist()

    def good_thread():
        failed.wait(60)
        with torch_tpu.eager_mode("fused"):
            value = (torch.arange(5.0, device="tpu") * 2).sum().item()
            torch.tpu.synchronize()  # reports this thread's checks: none failed
        valid_done.set()
        return value

    assert _in_threads(bad_thread, good_thread)[1] == 20.0


def test_random_ops_while_another_thread_traces_a_compiled_program():
    done = threading.Event()

    def compiling():
        try:
            for n in range(3, 7):  # each new shape traces the program again
                f = torch.compile(
                    lambda x: torch.nn.functional.dropout(x, 0.5).sum(), backend="tpu", dynamic=False
                )
                f(torch.ones(n, device="tpu")).item()
        finally:
            done.set()

    def sampling():
        draws = 0
        while not done.is_set() or draws < 5:
            assert torch.rand(3, device="tpu").sum().item() >= 0  # a concrete key, never a tracer
            draws += 1
        return draws

    _in_threads(compiling, sampling)


FORKED_WORKER = """
import multiprocessing, sys, torch, torch_tpu
from torch.utils.data import DataLoader, Dataset

class TouchesTpu(Dataset):
    def __len__(self): return 2
    def __getitem__(self, i): return torch.ones(2, device="tpu").sum().cpu()

if __name__ == "__main__":
    if sys.argv[1] == "started":
        torch.ones(1, device="tpu").item()   # the parent has started the device
    loader = DataLoader(TouchesTpu(), batch_size=1, num_workers=1,
                        multiprocessing_context=sys.argv[2])
    try:
        print("values", [b.item() for b in loader])
    except RuntimeError as error:
        print("error", str(error).replace(chr(10), " "))
"""


@pytest.mark.parametrize(
    "parent, context, expected",
    [("started", "fork", "error"), ("started", "spawn", "values"), ("idle", "fork", "values")],
)
def test_a_forked_worker_gets_a_clear_error_not_a_hang(tmp_path, parent, context, expected):
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(FORKED_WORKER)
    done = subprocess.run(
        [sys.executable, str(script), parent, context],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(expected), done.stdout + done.stderr
    if expected == "error":
        assert "forked subprocess" in done.stdout and "spawn" in done.stdout
    else:
        assert "[2.0, 2.0]" in done.stdout
