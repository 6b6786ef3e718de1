"""Factory overloads the OpInfo samples do not reach (windows, ranges, Tensor-bounded linspace,
``new_*``, generator/low forms of the random factories), each compared with PyTorch CPU."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

aten = torch.ops.aten
pytestmark = pytest.mark.filterwarnings("ignore:torch.range is deprecated")


def _bound(value, device):
    return torch.tensor(value, device=device)


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


CASES = {
    "full int": lambda d: torch.full((2, 3), 7, device=d),
    "full bool": lambda d: torch.full((2,), True, device=d),
    "full float dtype": lambda d: torch.full((3,), 2.5, dtype=torch.float16, device=d),
    "full complex": lambda d: torch.full((2,), 1 + 2j, device=d),
    "full truncates": lambda d: torch.full((2,), -2.7, dtype=torch.int32, device=d),
    "full out": lambda d: torch.full((2, 2), 3.0, out=torch.empty(0, device=d)),
    "zeros": lambda d: torch.zeros(2, 3, dtype=torch.int8, device=d),
    "ones": lambda d: torch.ones(4, device=d),
    "scalar_tensor": lambda d: torch.scalar_tensor(3, device=d),
    "scalar_tensor dtype": lambda d: torch.scalar_tensor(True, dtype=torch.bool, device=d),
    "full_like": lambda d: torch.full_like(_x(2, 3).to(d), 4.5, dtype=torch.int64),
    "zeros_like": lambda d: torch.zeros_like(_x(2, 3).to(d)),
    "ones_like": lambda d: torch.ones_like(_x(3).to(d), dtype=torch.bool),
    "new_full": lambda d: _x(2).to(d).new_full((3, 2), -1.5),
    "new_zeros": lambda d: _x(2).to(d).new_zeros((2, 2), dtype=torch.int16),
    "new_ones": lambda d: _x(2, dtype=torch.float64).to(d).new_ones(3),
    "arange.default": lambda d: torch.arange(7, device=d),
    "arange.default float": lambda d: torch.arange(2.5, device=d),
    "arange.start": lambda d: torch.arange(-3, 4, device=d, dtype=torch.float16),
    "range.step": lambda d: torch.range(0, 1, 0.3, device=d),
    "range.step int": lambda d: torch.range(5, 0, -2, dtype=torch.int64, device=d),
    "range.default": lambda d: aten.range.default(-2, 3, device=d),
    "arange.start_step": lambda d: torch.arange(1, 2, 0.25, device=d, dtype=torch.float64),
    "arange.start_out": lambda d: torch.arange(0, 9, 2, out=torch.empty(0, dtype=torch.int32, device=d)),
    "linspace.Tensor_Tensor": lambda d: torch.linspace(_bound(0.0, d), _bound(2.0, d), 5, device=d),
    "linspace.Tensor_Scalar": lambda d: torch.linspace(_bound(-1.0, d), 1, 4, dtype=torch.float64, device=d),
    "linspace.Scalar_Tensor": lambda d: torch.linspace(0, _bound(10, d), 6, dtype=torch.int64, device=d),
    "logspace.Tensor_Tensor": lambda d: torch.logspace(_bound(0.0, d), _bound(2.0, d), 5, device=d),
    "logspace.Tensor_Scalar": lambda d: torch.logspace(_bound(-1.0, d), 1, 4, base=2.0, device=d),
    "logspace.Scalar_Tensor": lambda d: torch.logspace(0, _bound(3.0, d), 4, device=d),
    "hann_window": lambda d: torch.hann_window(8, device=d),
    "hann_window.periodic": lambda d: torch.hann_window(7, periodic=False, device=d, dtype=torch.float64),
    "hamming_window": lambda d: torch.hamming_window(8, device=d),
    "hamming_window.periodic": lambda d: torch.hamming_window(5, False, device=d),
    "hamming_window.periodic_alpha": lambda d: torch.hamming_window(6, True, 0.6, device=d),
    "hamming_window.periodic_alpha_beta": lambda d: torch.hamming_window(6, False, 0.6, 0.3, device=d),
    "blackman_window": lambda d: torch.blackman_window(9, device=d),
    "blackman_window.periodic": lambda d: torch.blackman_window(9, False, device=d, dtype=torch.bfloat16),
    "bartlett_window": lambda d: torch.bartlett_window(7, device=d),
    "bartlett_window.periodic": lambda d: torch.bartlett_window(8, False, device=d),
    "kaiser_window": lambda d: torch.kaiser_window(6, device=d),
    "kaiser_window.periodic": lambda d: torch.kaiser_window(6, False, device=d),
    "kaiser_window.beta": lambda d: torch.kaiser_window(7, True, 5.0, device=d, dtype=torch.float64),
    "window length 1": lambda d: torch.hann_window(1, device=d),
    "window length 0": lambda d: torch.blackman_window(0, device=d),
}

# (The Tensor-bounded linspace/logspace build on ``device``, the default device when not given,
# wherever their bounds live: as PyTorch's own composites do.)

#: The same call must fail alike on CPU and tpu.
ERRORS = {
    "full overflow": lambda d: torch.full((2,), 300, dtype=torch.uint8, device=d),
    "full imaginary into real": lambda d: torch.full((2,), 1j, dtype=torch.float32, device=d),
    "range step 0": lambda d: torch.range(0, 3, 0, device=d),
    "range wrong sign": lambda d: torch.range(0, 3, -1, device=d),
    "linspace 1-d bound": lambda d: torch.linspace(torch.tensor([0.0]).to(d), torch.tensor(1.0).to(d), 3),
    "window integer dtype": lambda d: torch.hann_window(4, dtype=torch.int64, device=d),
    "window negative length": lambda d: torch.kaiser_window(-1, device=d),
}


@pytest.mark.parametrize("name", list(CASES))
def test_factory_matches_cpu(name):
    expected = CASES[name]("cpu")
    actual = CASES[name]("tpu")
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("name", list(ERRORS))
def test_factory_error_matches_cpu(name):
    with pytest.raises(Exception) as on_cpu:
        ERRORS[name]("cpu")
    with pytest.raises(type(on_cpu.value)):
        ERRORS[name]("tpu")


def _random_calls(d):
    """Each random factory overload (and each derived in-place fill) once: shape and dtype as on
    CPU, values in the range the call promises."""
    x = torch.zeros(3, 4, device=d)
    return {
        "rand": (torch.rand(2, 3, device=d), 0, 1),
        "rand.generator": (torch.rand(2, 3, generator=None, device=d, dtype=torch.float64), 0, 1),
        "randn": (torch.randn(5, device=d, dtype=torch.float16), -10, 10),
        "randn.generator": (torch.randn(5, generator=None, device=d), -10, 10),
        "randint": (torch.randint(6, (4,), device=d), 0, 5),
        "randint.generator": (torch.randint(6, (4,), generator=None, device=d), 0, 5),
        "randint.low": (torch.randint(-3, 3, (4,), device=d, dtype=torch.int8), -3, 2),
        "randint.low_generator": (torch.randint(2, 9, (4,), generator=None, device=d), 2, 8),
        "randperm": (torch.randperm(7, device=d), 0, 6),
        "randperm.generator": (torch.randperm(7, generator=None, device=d, dtype=torch.int32), 0, 6),
        "randperm.out": (torch.randperm(5, out=torch.empty(0, dtype=torch.int64, device=d)), 0, 4),
        "rand_like": (torch.rand_like(x), 0, 1),
        "rand_like.generator": (aten.rand_like.generator(x, generator=None), 0, 1),
        "randn_like": (torch.randn_like(x, dtype=torch.float64), -10, 10),
        "randn_like.generator": (aten.randn_like.generator(x, generator=None), -10, 10),
        "randint_like": (torch.randint_like(x, 4), 0, 3),
        "randint_like.generator": (aten.randint_like.generator(x, 4, generator=None), 0, 3),
        "randint_like.low_dtype": (torch.randint_like(x, 2, 5, dtype=torch.int16), 2, 4),
        "randint_like.low_generator_dtype": (
            aten.randint_like.low_generator_dtype(x, 2, 5, generator=None),
            2,
            4,
        ),
        "randint_like.Tensor": (aten.randint_like.Tensor(x, torch.tensor(4)), 0, 3),
        "randint_like.Tensor_generator": (
            aten.randint_like.Tensor_generator(x, torch.tensor(4), generator=None),
            0,
            3,
        ),
        "normal.float_float": (torch.normal(2.0, 0.5, (6,), device=d), -10, 10),
        "normal.Tensor_float": (torch.normal(torch.zeros(3, device=d), 0.5), -10, 10),
        "normal.float_Tensor": (torch.normal(1.0, torch.ones(3, device=d)), -10, 10),
        "random_.default": (torch.zeros(8, dtype=torch.int64, device=d).random_(), 0, 2**63 - 1),
        "random_.default bool": (torch.zeros(8, dtype=torch.bool, device=d).random_(), 0, 1),
        "random_.to": (torch.zeros(8, device=d).random_(5), 0, 4),
        "random_.from": (torch.zeros(8, dtype=torch.int16, device=d).random_(-4, 4), -4, 3),
        "random_.from to=None": (torch.zeros(8, dtype=torch.float16, device=d).random_(3, None), 3, 2**11),
        "cauchy_": (torch.zeros(8, device=d).cauchy_(), float("-inf"), float("inf")),
        "geometric_ int": (torch.zeros(8, dtype=torch.int32, device=d).geometric_(0.5), 1, 200),
        "bernoulli_.float int": (torch.zeros(8, dtype=torch.uint8, device=d).bernoulli_(0.5), 0, 1),
        "bernoulli_.Tensor": (torch.zeros(2, 4, device=d).bernoulli_(torch.full((4,), 0.5, device=d)), 0, 1),
        "bernoulli.p": (aten.bernoulli.p(x, 0.5), 0, 1),
        "uniform_ complex": (
            torch.view_as_real(torch.zeros(4, dtype=torch.complex64, device=d).uniform_(2, 3)),
            2,
            3,
        ),
        "log_normal_ half": (torch.zeros(8, dtype=torch.bfloat16, device=d).log_normal_(0, 0.5), 0, 100),
        "exponential_ double": (torch.zeros(8, dtype=torch.float64, device=d).exponential_(3), 0, 100),
    }


def test_random_factories_shape_dtype_and_range():
    expected, actual = _random_calls("cpu"), _random_calls("tpu")
    for name, (value, low, high) in actual.items():
        reference = expected[name][0]
        assert value.device.type == "tpu", name
        assert (value.shape, value.dtype) == (reference.shape, reference.dtype), name
        values = value.cpu().double()
        assert bool(((values >= low) & (values <= high)).all()), (name, values)


RANDOM_ERRORS = {
    "generator on another device": lambda d: torch.rand(3, device=d, generator=torch.Generator()),
    "in-place with a cpu generator": lambda d: torch.zeros(3, device=d).cauchy_(generator=torch.Generator()),
    "uniform_ from > to": lambda d: torch.zeros(3, device=d).uniform_(2, 1),
    "uniform_ integer": lambda d: torch.zeros(3, dtype=torch.int64, device=d).uniform_(),
    "normal_ std < 0": lambda d: torch.zeros(3, device=d).normal_(0, -1),
    "normal std tensor < 0": lambda d: torch.normal(
        torch.zeros(2, device=d), torch.tensor([1.0, -1.0]).to(d)
    ),
    "random_ from >= to": lambda d: torch.zeros(3, device=d).random_(3, 3),
    "random_ out of dtype": lambda d: torch.zeros(3, dtype=torch.int8, device=d).random_(0, 300),
    "randint low >= high": lambda d: torch.randint(5, 2, (3,), device=d),
    "bernoulli_ p > 1": lambda d: torch.zeros(3, device=d).bernoulli_(1.5),
    "bernoulli p tensor > 1": lambda d: torch.bernoulli(torch.full((3,), 1.5, device=d)),
    "exponential_ lambda <= 0": lambda d: torch.zeros(3, device=d).exponential_(0),
    "exponential_ integer": lambda d: torch.zeros(3, dtype=torch.int32, device=d).exponential_(),
    "cauchy_ sigma <= 0": lambda d: torch.zeros(3, device=d).cauchy_(0, 0),
    "geometric_ p = 1": lambda d: torch.zeros(3, device=d).geometric_(1),
    "log_normal_ std <= 0": lambda d: torch.zeros(3, device=d).log_normal_(0, 0),
    "poisson negative rate": lambda d: torch.poisson(torch.tensor([-1.0]).to(d)),
    "gamma half": lambda d: torch._standard_gamma(torch.ones(2, dtype=torch.float16, device=d)),
    "randperm negative": lambda d: torch.randperm(-1, device=d),
    "multinomial negative": lambda d: torch.multinomial(torch.tensor([1.0, -1.0]).to(d), 1),
    "multinomial nan": lambda d: torch.multinomial(torch.tensor([1.0, float("nan")]).to(d), 1),
    "multinomial zero sum": lambda d: torch.multinomial(torch.zeros(2, 2, device=d), 1),
    "multinomial too many": lambda d: torch.multinomial(torch.ones(2, device=d), 3),
    "multinomial no samples": lambda d: torch.multinomial(torch.ones(2, device=d), 0),
    "multinomial 3-d": lambda d: torch.multinomial(torch.ones(2, 2, 2, device=d), 1),
    "multinomial integer": lambda d: torch.multinomial(torch.ones(2, dtype=torch.int64, device=d), 1),
    "randint_like 1-d high": lambda d: torch.randint_like(torch.zeros(3, device=d), torch.tensor([5])),
}


@pytest.mark.parametrize("name", list(RANDOM_ERRORS))
def test_random_error_matches_cpu(name):
    call = RANDOM_ERRORS[name]
    if name.startswith(("generator", "in-place with")):  # CPU accepts its own generator: as CUDA
        with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator"):
            call("tpu")
        return
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(type(on_cpu.value)):
        call("tpu")


def test_gradient_helpers_match_cpu():
    """_standard_gamma_grad and _dirichlet_grad (the reparameterized gradients of Gamma and
    Dirichlet samples) over every branch of torch's approximations."""
    alpha = torch.tensor([0.5, 1.0, 3.0, 5.0, 20.0, 20.0, 20.0, 50.0])
    sample = torch.tensor([0.3, 0.5, 2.0, 5.0, 19.0, 10.0, 30.0, 52.0])
    for dtype in (torch.float32, torch.float64):
        a, x = alpha.to(dtype), sample.to(dtype)
        torch.testing.assert_close(
            torch._standard_gamma_grad(a.to("tpu"), x.to("tpu")).cpu(),
            torch._standard_gamma_grad(a, x),
            rtol=1e-5,
            atol=1e-6,
        )
    x = torch.tensor([0.01, 0.3, 0.4, 0.9, 0.99, 0.5, 0.45, 0.2], dtype=torch.float64)
    concentration = torch.tensor([0.5, 2.0, 10.0, 3.0, 4.0, 30.0, 9.0, 1.5], dtype=torch.float64)
    total = torch.tensor([1.0, 5.0, 25.0, 4.0, 4.5, 60.0, 20.0, 2.0], dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        args = [t.to(dtype) for t in (x, concentration, total)]
        torch.testing.assert_close(
            torch._dirichlet_grad(*[t.to("tpu") for t in args]).cpu(),
            torch._dirichlet_grad(*args),
            rtol=1e-5,
            atol=1e-6,
        )


FOREIGN_DEVICE = {
    "zeros_like": lambda x: torch.zeros_like(x, device="cpu"),
    "full_like": lambda x: torch.full_like(x, 2.5, device="cpu"),
    "new_ones": lambda x: x.new_ones(3, device="cpu"),
    "rand_like": lambda x: torch.rand_like(x, device="cpu"),
    "randint_like": lambda x: torch.randint_like(x, 3, device="cpu"),
}


@pytest.mark.parametrize("name", list(FOREIGN_DEVICE))
def test_like_factories_honour_another_device(name):
    """``zeros_like(tpu_tensor, device="cpu")`` builds a CPU tensor, as PyTorch's composite does."""
    expected = FOREIGN_DEVICE[name](_x(2, 3))
    actual = FOREIGN_DEVICE[name](_x(2, 3).to("tpu"))
    assert actual.device.type == "cpu"
    assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype)


def _ranges():
    """Float ranges of every length class: tails only, vectors and tail, several CPU threads'
    chunks (over 32768 elements), descending, fractional starts."""
    starts, steps = (0, 1.5, -5.5, 1e3, -2.3), (0.1, 0.3, 0.37, 1.1, -0.4, 2 / 3)
    for start in starts:
        for step in steps:
            for count in (3, 6, 17, 34, 70):
                yield start, start + step * (count - 0.5), step
    yield 0, 5000, 0.1
    yield -3.3, 40000.7, 0.77


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_arange_with_float_steps_has_cpus_count_and_values(dtype):
    """Bit for bit: CPU's kernel rounds ``start + i * step`` per vector lane (and with FMA), so a
    plain formula differs in the last bit for about half of these ranges."""
    for start, end, step in _ranges():
        expected = torch.arange(start, end, step, dtype=dtype)
        actual = torch.arange(start, end, step, dtype=dtype, device="tpu").cpu()
        assert actual.shape == expected.shape, (start, end, step)
        assert torch.equal(actual, expected), (start, end, step)


def test_arange_of_integers_with_a_fractional_step_behaves_as_on_cpu():
    for dtype in (torch.int32, torch.int16, torch.uint8):  # the step truncates to 0: all start
        torch.testing.assert_close(
            torch.arange(0, 1, 0.1, dtype=dtype, device="tpu").cpu(), torch.arange(0, 1, 0.1, dtype=dtype)
        )
    with pytest.raises(ValueError, match="step must be nonzero"):  # int64 counts in integers
        torch.arange(0, 1, 0.1, dtype=torch.int64, device="tpu")
    for args in ((0, 1, 0.0), (0, 1, 0), (0, float("inf"), 1.0), (0, -1, 1)):
        with pytest.raises(RuntimeError) as on_cpu:
            torch.arange(*args)
        with pytest.raises(RuntimeError, match=str(on_cpu.value).split(":")[0]):
            torch.arange(*args, device="tpu")
