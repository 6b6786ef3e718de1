"""Derived ``out=`` (and in-place) variants refuse what CPU's kernels refuse, with CPU's message.

Overlap: an output sharing memory with an input is refused exactly where CPU's kernel refuses it
(``at::assert_no_overlap`` and friends), per op and per argument: ``scatter(x, ..., out=x)`` is
fine while ``scatter(..., src=y, out=y)`` is not. Dtypes: an ``out=`` of another dtype than the
result is refused by the ops whose CPU kernels demand one (structured kernels, ``multinomial``),
in their words, and cast by the others. Each call runs on CPU and on tpu: both raise the same
error, or both compute the same result."""

from __future__ import annotations

import pytest
import torch
import yaml

from torch_tpu.runtime import overlap

aten = torch.ops.aten


def _floats(n, device):
    return torch.arange(float(n), device=device)


def _ints(n, device):
    return torch.arange(n, device=device) % 2


def _out_is(make, build):
    """``build(x, device)`` with ``x = make(device)`` written and read: the call's output is x."""

    def call(device):
        x = make(device)
        build(x, device)
        return x

    return call


F4, I4 = (lambda d: _floats(4, d)), (lambda d: _ints(4, d))
CASES = {
    # CPU refuses: the op reads the input at other positions than it writes
    "gather_out_self": _out_is(F4, lambda x, d: aten.gather.out(x, 0, _ints(4, d), out=x)),
    "take_out_index": _out_is(I4, lambda i, d: aten.take.out(_ints(4, d), i, out=i)),
    "index_select_out_index": _out_is(I4, lambda i, d: aten.index_select.out(_ints(4, d), 0, i, out=i)),
    "index_out_self": _out_is(F4, lambda x, d: aten.index.Tensor_out(x, [_ints(4, d)], out=x)),
    "masked_select_out_self": _out_is(
        lambda d: _ints(4, d).bool(), lambda x, d: aten.masked_select.out(x, x, out=x)
    ),
    "nonzero_out_self": _out_is(lambda d: _ints(4, d)[:, None], lambda x, d: aten.nonzero.out(x, out=x)),
    "kthvalue_values_self": _out_is(F4, lambda x, d: torch.kthvalue(x, 2, out=(x, _ints(1, d)[0]))),
    "cross_out_self": _out_is(
        lambda d: _floats(3, d), lambda x, d: torch.linalg.cross(x, _floats(3, d), out=x)
    ),
    "cross_out_other": _out_is(
        lambda d: _floats(3, d), lambda x, d: torch.linalg.cross(_floats(3, d), x, out=x)
    ),
    "cat_out_is_input": _out_is(F4, lambda x, d: torch.cat([x], out=x)),
    "scatter_out_src": _out_is(
        F4, lambda s, d: aten.scatter.src_out(_floats(4, d), 0, _ints(4, d), s, out=s)
    ),
    "scatter_out_index": _out_is(I4, lambda i, d: aten.scatter.value_out(_ints(4, d), 0, i, 1, out=i)),
    "index_add_out_source": _out_is(
        F4, lambda s, d: aten.index_add.out(_floats(4, d), 0, _ints(4, d), s, out=s)
    ),
    "index_copy_out_index": _out_is(
        I4, lambda i, d: aten.index_copy.out(_ints(4, d), 0, torch.arange(4, device=d), i, out=i)
    ),
    "index_put_in_place_from_itself": _out_is(F4, lambda x, d: x.index_put_([_ints(4, d)], x)),
    # a resize moves the output onto the index: checked once resized, as CPU's gather does
    "gather_out_resized_onto_index": lambda d: (lambda i: aten.gather.out(_ints(3, d), 0, i[1:], out=i[:1]))(
        torch.tensor([2, 1, 0], device=d)
    ),
    # elementwise: partial overlap only
    "add_out_shifted": lambda d: (lambda x: torch.add(x[:-1], 1, out=x[1:]))(_floats(5, d)),
    # CPU allows these (the output may be the input it updates, or one it reads at the same
    # positions; generated out= overloads compute into a new tensor first)
    "add_out_self": _out_is(F4, lambda x, d: torch.add(x, x, out=x)),
    "gather_out_index": _out_is(I4, lambda i, d: aten.gather.out(_ints(4, d), 0, i, out=i)),
    "scatter_out_self": _out_is(
        F4, lambda x, d: aten.scatter.src_out(x, 0, _ints(2, d), _floats(2, d), out=x)
    ),
    "scatter_add_out_self": _out_is(
        F4, lambda x, d: aten.scatter_add.out(x, 0, _ints(2, d), _floats(2, d), out=x)
    ),
    "scatter_reduce_out_self": _out_is(
        F4, lambda x, d: aten.scatter_reduce.two_out(x, 0, _ints(2, d), _floats(2, d), "sum", out=x)
    ),
    "index_add_out_self": _out_is(
        F4, lambda x, d: aten.index_add.out(x, 0, _ints(2, d), _floats(2, d), out=x)
    ),
    "index_copy_out_self": _out_is(
        F4, lambda x, d: aten.index_copy.out(x, 0, _ints(2, d), _floats(2, d), out=x)
    ),
    "put_out_source": _out_is(F4, lambda s, d: aten.put.out(_floats(4, d), _ints(4, d), s, out=s)),
    "index_put_out_values": _out_is(
        F4, lambda v, d: aten.index_put.out(_floats(4, d), [_ints(4, d)], v, out=v)
    ),
    "kthvalue_indices_self": _out_is(I4, lambda x, d: torch.kthvalue(x, 1, out=(_ints(1, d)[0], x))),
}


def _run(case, device):
    try:
        return case(device), None
    except RuntimeError as error:
        return None, error


@pytest.mark.parametrize("name", CASES)
def test_out_overlap_refused_as_on_cpu(name):
    cpu, cpu_error = _run(CASES[name], "cpu")
    tpu, tpu_error = _run(CASES[name], "tpu")
    if cpu_error is not None:
        assert "single memory location" in str(cpu_error)
        assert str(tpu_error) == str(cpu_error)
    else:
        assert tpu_error is None, f"CPU allows it, tpu raises {tpu_error}"
        torch.testing.assert_close(tpu.cpu(), cpu)


def test_generated_out_overloads_are_native_functions_autogen():
    """``GENERATED_OUT`` lists exactly the ``autogen`` out= overloads of the no-overlap ops."""
    import torchgen

    path = f"{torchgen.__path__[0]}/packaged/ATen/native/native_functions.yaml"
    with open(path) as f:
        entries = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    autogen = {name.strip() for e in entries if e.get("autogen") for name in str(e["autogen"]).split(",")}
    assert overlap.GENERATED_OUT == {
        name for name in autogen if name.endswith("out") and name.split(".")[0] in overlap.NO_OVERLAP_OPS
    }


OUT_DTYPES = {  # (the call with an out= tensor maker, the out= dtype)
    "gather": lambda o, d: torch.gather(_floats(4, d), 0, _ints(2, d), out=o(d)),
    "aminmax": lambda o, d: torch.aminmax(_floats(4, d), dim=0, out=(o(d), o(d))),
    "amax": lambda o, d: torch.amax(_floats(4, d), 0, out=o(d)),
    "amin": lambda o, d: torch.amin(_floats(4, d), 0, out=o(d)),
    "multinomial": lambda o, d: torch.multinomial(_floats(4, d) + 1, 2, out=o(d)),
    "complex": lambda o, d: torch.complex(_floats(4, d), _floats(4, d), out=o(d)),
    "polar": lambda o, d: torch.polar(_floats(4, d), _floats(4, d), out=o(d)),
    "add_casts": lambda o, d: torch.add(_floats(4, d), 1, out=o(d)),  # TensorIterator: cast rule
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.complex128], ids=str)
@pytest.mark.parametrize("name", OUT_DTYPES)
def test_out_dtype_refused_as_on_cpu(name, dtype):
    def call(device):
        return OUT_DTYPES[name](lambda d: torch.empty((), dtype=dtype, device=d), device)

    cpu, cpu_error = _run(call, "cpu")
    tpu, tpu_error = _run(call, "tpu")
    if cpu_error is not None:
        assert str(tpu_error) == str(cpu_error)
    elif name != "multinomial":  # (random draws: only the acceptance compares)
        assert tpu_error is None, f"CPU allows it, tpu raises {tpu_error}"
        torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), tpu), cpu)
