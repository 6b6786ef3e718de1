"""Optimizer paths on tpu against PyTorch CPU: every functional ``_foreach_*`` overload (and its
derived in-place form), the fused optimizers through ``torch.optim``, and AMP's GradScaler."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import torch_tpu  # noqa: F401
from torch_tpu.ops.registry import LOWERINGS

aten = torch.ops.aten

SHAPES = [(2, 3), (4,), ()]  # one foreach list: mixed shapes, a 0-dim tensor included


def _tensors(seed, dtypes=(torch.float32,) * 3, low=0.5, high=2.0):
    """Values in [low, high): defined for log, sqrt, pow with any exponent, acosh..."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)
        for shape, dtype in zip(SHAPES, dtypes)
    ]


def _unit(seed):
    """Values in (-0.9, 0.9): inside the domain of asin, acos, atanh."""
    return _tensors(seed, low=-0.9, high=0.9)


def _argument(arg: torch._C.Argument, seed: int, dtypes):
    kind = str(arg.type)
    if kind == "List[Tensor]":
        return _tensors(seed, dtypes)
    if kind == "List[number]":
        return [0.5, 2, 1.5]  # an int among floats: each promotes on its own
    if kind == "number":
        return 0.75
    if kind == "Tensor":  # add.Tensor's shared 0-dim scalar; addcmul.Tensor's one per tensor
        return torch.tensor([0.5, 2.0, -1.5]) if arg.name == "scalars" else torch.tensor(1.25)
    raise AssertionError(f"no test value for {arg}")


def _schema_arguments(op, dtypes=(torch.float32,) * 3):
    """Positional arguments built from the schema (defaults left to the op)."""
    return [
        _argument(a, seed, dtypes)
        for seed, a in enumerate(op._schema.arguments)
        if not a.has_default_value() and not a.kwarg_only
    ]


def _mixed(op):
    """The same call on a list mixing float32, int64 and float64 tensors."""
    return _schema_arguments(op, (torch.float32, torch.int64, torch.float64))


SPECIAL_ARGUMENTS = {
    "_foreach_mm.default": lambda: [
        [torch.randn(2, 3), torch.randn(1, 4), torch.randn(3, 3)],
        [torch.randn(3, 5), torch.randn(4, 2), torch.randn(3, 1)],
    ],
    "_foreach_asin.default": lambda: [_unit(0)],
    "_foreach_acos.default": lambda: [_unit(0)],
    "_foreach_sign.default": lambda: [_unit(0)],
    "_foreach_round.default": lambda: [[t * 3 for t in _unit(0)]],
    "_foreach_copy.default": lambda: [_tensors(0), [torch.randn(3), torch.arange(4), torch.tensor(2.5)]],
    "_foreach_powsum.Scalar": lambda: [_unit(0), 3],
    "_foreach_pow.ScalarAndTensor": lambda: [1.5, _tensors(1)],
    "_foreach_add.List alpha": lambda: [_tensors(0), _tensors(1)],
    "_foreach_lerp.List": lambda: [_tensors(0), _tensors(1), _unit(2)],
    "_foreach_add.Scalar int": lambda: [_tensors(0, (torch.int64, torch.int32, torch.uint8), 0, 9), 3],
    "_foreach_powsum.Scalar complex": lambda: [
        [torch.randn(3, dtype=torch.complex64), torch.randn(4), torch.tensor(2.0)],
        2,
    ],
    "_foreach_powsum.Scalar int": lambda: [[torch.randn(3), torch.arange(4)], 2],  # CPU raises
    "_foreach_powsum.Scalar half to float": lambda: [
        [torch.randn(3).half(), torch.randn(4).bfloat16(), torch.tensor(2.0)],
        2.5,
    ],
}
KEYWORDS = {
    "_foreach_add.List alpha": {"alpha": -2},
    "_foreach_sub.List": {"alpha": 0.5},
    "_foreach_powsum.Scalar half to float": {"dtype": torch.float32},
}
# No mixed-dtype call for: lerp and mm (one dtype per call), copy (casts anyway), powsum (floats
# only), round and max (covered by the float list); frac and addcdiv, whose single-tensor
# lowerings (elementwise.py) accept the integer tensors CPU rejects
MIXED_DTYPE_SKIP = (
    "_foreach_lerp",
    "_foreach_mm",
    "_foreach_copy",
    "_foreach_powsum",
    "_foreach_round",
    "_foreach_max",
    "_foreach_frac",
    "_foreach_addcdiv",
)


def _name(op) -> str:
    return f"{op._schema.name[6:]}.{op._overloadname}"


FOREACH_OPS = {
    _name(op): op
    for op in LOWERINGS
    if op._schema.name.startswith("aten::_foreach_") and LOWERINGS[op].family == "optim"
}
CASES = {
    name: (op, lambda op=op, name=name: SPECIAL_ARGUMENTS.get(name, lambda: _schema_arguments(op))())
    for name, op in FOREACH_OPS.items()
}
CASES.update(
    {
        name: (FOREACH_OPS[name.split(" ")[0]], build)
        for name, build in SPECIAL_ARGUMENTS.items()
        if " " in name
    }
)
CASES.update(
    {
        f"{name} mixed dtypes": (op, lambda op=op: _mixed(op))
        for name, op in FOREACH_OPS.items()
        if not name.startswith(MIXED_DTYPE_SKIP)
    }
)


def _to(device):
    def move(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        return [move(v) for v in x] if isinstance(x, list) else x

    return move


def _run(op, args, kwargs, device):
    # a Tensor overload's one-per-tensor ``scalars`` stay on the host (PyTorch reads them there)
    args = [a if isinstance(a, torch.Tensor) and a.dim() == 1 else _to(device)(a) for a in args]
    try:
        return op(*args, **kwargs), None
    except Exception as error:  # noqa: BLE001  (compared with CPU's error below)
        return None, error


def _inplace(op):
    """``_foreach_add_.List`` for ``_foreach_add.List`` (derived by the dispatcher)."""
    packet = getattr(aten, op._schema.name[6:] + "_", None)
    if packet is None or op._overloadname not in packet.overloads():
        return None
    return getattr(packet, op._overloadname)


@pytest.mark.parametrize("name", list(CASES))
def test_foreach_matches_cpu(name):
    op, build = CASES[name]
    args, kwargs = build(), KEYWORDS.get(name, {})
    expected, cpu_error = _run(op, args, kwargs, "cpu")
    actual, tpu_error = _run(op, args, kwargs, "tpu")
    if cpu_error is not None:
        assert type(tpu_error) is type(cpu_error), f"CPU raised {cpu_error!r}, tpu {tpu_error!r}"
        return
    assert tpu_error is None, f"tpu raised {tpu_error!r}"
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.device.type == "tpu"
        torch.testing.assert_close(a.cpu(), e, equal_nan=True)

    inplace = _inplace(op)
    if inplace is None or not isinstance(args[0], list):
        return
    cpu_targets, tpu_targets = [t.clone() for t in args[0]], _to("tpu")(args[0])
    _, cpu_error = _run(inplace, [cpu_targets, *args[1:]], kwargs, "cpu")
    _, tpu_error = _run(inplace, [tpu_targets, *args[1:]], kwargs, "tpu")
    assert type(tpu_error) is type(cpu_error), f"in-place: CPU raised {cpu_error!r}, tpu {tpu_error!r}"
    for a, e in zip(tpu_targets, cpu_targets):
        torch.testing.assert_close(a.cpu(), e, equal_nan=True)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda d: torch._foreach_add([], 1.0), "at least one tensor"),
        (
            lambda d: torch._foreach_add([torch.ones(2, device=d)] * 2, [torch.ones(2, device=d)]),
            "same number of tensors",
        ),
        (lambda d: torch._foreach_mul([torch.ones(2, device=d)] * 2, [1.0]), "scalar list"),
        (lambda d: torch._foreach_add([torch.ones(2, device=d)], torch.ones(2, device=d)), "0 dim"),
        (
            lambda d: torch._foreach_addcmul(
                [torch.ones(2, device=d)] * 2,
                [torch.ones(2, device=d)] * 2,
                [torch.ones(2, device=d)] * 2,
                torch.ones(3),
            ),
            "length of scalars",
        ),
    ],
)
def test_foreach_argument_errors_match_cpu(call, error):
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match=error):
            call(device)


def test_foreach_scalars_must_be_on_the_host():
    """``_foreach_*.Tensor`` reads its one-per-tensor ``scalars`` on the host, as CUDA does."""
    xs = [torch.ones(2, device="tpu")] * 3
    with pytest.raises(RuntimeError, match="Expected scalars to be on CPU, got tpu:0 instead"):
        torch._foreach_addcmul(xs, xs, xs, torch.ones(3, device="tpu"))
    results = torch._foreach_addcmul(xs, xs, xs, torch.tensor([0.5, 2.0, -1.0]))
    assert [r.tolist() for r in results] == [[1.5, 1.5], [3.0, 3.0], [0.0, 0.0]]


def _foreach_opinfos():
    from torch.testing._internal import common_methods_invocations as opinfos

    return {
        op.name: op
        for op in (
            opinfos.foreach_unary_op_db
            + opinfos.foreach_binary_op_db
            + opinfos.foreach_pointwise_op_db
            + opinfos.foreach_reduce_op_db
            + opinfos.foreach_other_op_db
        )
    }


FOREACH_OPINFOS = _foreach_opinfos()  # not in op_db, so test_opinfo.py does not run them
# mm accumulates in a different order: near-cancelling sums differ past float32's default atol
OPINFO_TOLERANCES = {"_foreach_mm": {"atol": 1e-4, "rtol": 1.3e-6}}


@pytest.mark.parametrize("name", list(FOREACH_OPINFOS))
def test_foreach_opinfo_samples_match_cpu(name):
    """PyTorch's own foreach samples (Scalar lists mixing bool/int/float/complex, Tensor
    overloads...), float32, the samples CPU accepts."""
    op = FOREACH_OPINFOS[name]
    ran = 0
    for sample in itertools.islice(op.sample_inputs("cpu", torch.float32, num_input_tensors=[3]), 4):
        args = [sample.input, *sample.args]
        expected, cpu_error = _run(op.method_variant, args, sample.kwargs, "cpu")
        if cpu_error is not None:
            continue
        actual, tpu_error = _run(op.method_variant, args, sample.kwargs, "tpu")
        assert tpu_error is None, f"tpu raised {tpu_error!r}"
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), e, equal_nan=True, **OPINFO_TOLERANCES.get(name, {}))
        ran += 1
    assert ran, "CPU ran no sample"


# ----------------------------------------------------------------------------- optimizers
def _model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).to(device)


def _batch(step, device):
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(5, 4, generator=generator).to(device)


def _train(device, optimizer_class, options, steps=5, scheduler=False):
    model = _model(device)
    optimizer = optimizer_class(model.parameters(), **options)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.7) if scheduler else None
    for step in range(steps):
        optimizer.zero_grad()
        model(_batch(step, device)).pow(2).sum().backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
    return [p.detach().cpu() for p in model.parameters()]


OPTIMIZERS = {
    "adam amsgrad": (torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    "adam maximize weight_decay": (torch.optim.Adam, {"lr": 0.01, "maximize": True, "weight_decay": 0.1}),
    "adam tensor lr": (torch.optim.Adam, {"lr": torch.tensor(0.01)}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "adamw tensor lr": (torch.optim.AdamW, {"lr": torch.tensor(0.01), "weight_decay": 0.1}),
    "sgd momentum tensor lr": (torch.optim.SGD, {"lr": torch.tensor(0.05), "momentum": 0.9}),
    "adagrad tensor lr": (torch.optim.Adagrad, {"lr": torch.tensor(0.1)}),
    "adamw amsgrad maximize": (torch.optim.AdamW, {"lr": 0.01, "amsgrad": True, "maximize": True}),
    "sgd": (torch.optim.SGD, {"lr": 0.05}),
    "sgd momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1}),
    "sgd nesterov weight_decay": (
        torch.optim.SGD,
        {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    ),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1, "maximize": True}),
}


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_cpu_fused(name, implementation):
    optimizer_class, options = OPTIMIZERS[name]
    if implementation == "foreach" and isinstance(options["lr"], torch.Tensor):
        pytest.skip("a tensor lr with foreach needs capturable=True")
    expected = _train("cpu", optimizer_class, dict(options, fused=True))
    actual = _train("tpu", optimizer_class, dict(options, **{implementation: True}))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.SGD])
def test_scheduled_lr_matches_cpu(optimizer_class):
    options = {"lr": 0.05, "fused": True}
    expected = _train("cpu", optimizer_class, options, scheduler=True)
    actual = _train("tpu", optimizer_class, options, scheduler=True)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_default_optimizer_takes_the_foreach_path_on_tpu():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = list(_model("tpu").parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False) == (False, True)
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=True) == (True, False)


# ----------------------------------------------------------------------------- AMP
def _scaled_training(device, fused, poisoned_steps=(2,)):
    """Steps of GradScaler training; in ``poisoned_steps`` one gradient becomes inf."""
    model = _model(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, fused=fused)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    history = []
    for step in range(5):
        optimizer.zero_grad()
        scaler.scale(model(_batch(step, device)).pow(2).sum()).backward()
        if step in poisoned_steps:
            with torch.no_grad():
                model[0].weight.grad[0, 0] = float("inf")
        before = [p.detach().cpu().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        after = [p.detach().cpu() for p in model.parameters()]
        skipped = all(torch.equal(a, b) for a, b in zip(after, before))
        history.append((skipped, scaler.get_scale()))
    return history, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_matches_cpu(fused):
    expected_history, expected = _scaled_training("cpu", fused)
    history, actual = _scaled_training("tpu", fused)
    assert history == expected_history
    skipped, scales = zip(*history)
    assert skipped == (False, False, True, False, False)
    assert scales[2] == scales[1] / 2  # backed off on the inf step
    assert scales[1] == 2 * scales[0]  # grew after growth_interval clean steps
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_amp_kernels_match_cpu():
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([[float("nan")]]), torch.tensor(3.0)]
    results = []
    for device in ("cpu", "tpu"):
        found_inf = torch.zeros((), device=device)
        local = [g.clone().to(device) for g in grads]
        torch._amp_foreach_non_finite_check_and_unscale_(local, found_inf, torch.tensor(0.5, device=device))
        scale = torch.full((), 4.0, device=device)
        tracker = torch.ones((), dtype=torch.int32, device=device)
        outcomes = []
        for found in (0.0, 0.0, 1.0):
            torch._amp_update_scale_(scale, tracker, torch.tensor(found, device=device), 2.0, 0.5, 2)
            outcomes += [scale.cpu().clone(), tracker.cpu().clone()]
        results.append([t.cpu() for t in local] + [found_inf.cpu()] + outcomes)
    for a, e in zip(*results[::-1]):
        torch.testing.assert_close(a, e, equal_nan=True)
