"""``torch.Generator(device="tpu")``: seeds, state, and ``generator=`` on tpu random ops, against
the CPU generator's semantics (the values differ: the bit generators do)."""

from __future__ import annotations

import pytest
import torch

from . import needs_native

pytestmark = needs_native

_DRAWS = {
    "randn": lambda g: torch.randn(5, device="tpu", generator=g),
    "rand": lambda g: torch.rand(5, device="tpu", generator=g),
    "randint": lambda g: torch.randint(0, 100, (5,), device="tpu", generator=g),
    "randperm": lambda g: torch.randperm(7, device="tpu", generator=g),
    "normal_": lambda g: torch.empty(5, device="tpu").normal_(generator=g),
    "uniform_": lambda g: torch.empty(5, device="tpu").uniform_(generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((5,), 0.5, device="tpu"), generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(4, device="tpu"), 3, generator=g),
}


def _generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def test_a_new_generator_is_a_tpu_generator_seeded_as_on_cpu():
    tpu, cpu = torch.Generator(device="tpu"), torch.Generator()
    assert tpu.device == torch.device("tpu", 0)
    assert tpu.initial_seed() == cpu.initial_seed()
    assert _generator("tpu", 5).initial_seed() == 5


def test_state_round_trips():
    g = _generator("tpu", 11)
    torch.randn(3, device="tpu", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    first = torch.randn(6, device="tpu", generator=g).cpu()
    torch.randn(6, device="tpu", generator=g)
    g.set_state(state)
    assert torch.equal(torch.randn(6, device="tpu", generator=g).cpu(), first)
    assert torch.equal(_generator("tpu", 0).set_state(state).get_state(), state)


def test_a_bad_state_is_refused_as_on_cpu():
    g = torch.Generator(device="tpu")
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        g.set_state(torch.zeros(16))
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(8, dtype=torch.uint8))


@pytest.mark.parametrize("op", sorted(_DRAWS))
def test_same_seed_same_stream(op):
    draw = _DRAWS[op]
    a, b = _generator("tpu", 3), _generator("tpu", 3)
    first = [draw(a).cpu() for _ in range(2)]
    assert all(torch.equal(draw(b).cpu(), x) for x in first)
    assert not torch.equal(first[0], first[1]) or op == "bernoulli"  # a stream, not a repeat


@pytest.mark.parametrize("op", sorted(_DRAWS))
def test_a_generator_is_independent_of_the_default_one(op):
    draw = _DRAWS[op]
    expected = draw(_generator("tpu", 9)).cpu()
    torch.manual_seed(0)
    g = _generator("tpu", 9)
    torch.randn(4, device="tpu")  # the default generator moves; g does not
    default_state = torch.tpu.get_rng_state()
    assert torch.equal(draw(g).cpu(), expected)
    assert torch.equal(torch.tpu.get_rng_state(), default_state)  # nor does g move it


def test_manual_seed_seeds_the_default_generator():
    torch.manual_seed(21)
    (default,) = torch.tpu.default_generators
    assert default.initial_seed() == 21 == torch.tpu.initial_seed()
    a = torch.randn(4, device="tpu").cpu()
    torch.tpu.manual_seed(21)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), a)
    default.manual_seed(21)  # the same generator as torch.tpu's
    assert torch.equal(torch.randn(4, device="tpu").cpu(), a)
    assert torch.equal(torch.randn(4, device="tpu", generator=_generator("tpu", 21)).cpu(), a)


def test_rng_state_of_the_module_is_the_default_generators():
    torch.tpu.manual_seed(4)
    assert torch.equal(torch.tpu.get_rng_state(), torch.tpu.default_generators[0].get_state())
    torch.randn(2, device="tpu")
    assert torch.tpu.default_generators[0].get_offset() == 1


def test_fork_rng_restores_the_tpu_stream():
    torch.manual_seed(8)
    with torch.random.fork_rng(device_type="tpu"):
        torch.randn(4, device="tpu")
    after = torch.randn(4, device="tpu").cpu()
    torch.manual_seed(8)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), after)


def test_dropout_follows_the_default_generator():
    x = torch.ones(64, device="tpu")
    torch.manual_seed(2)
    a = torch.nn.functional.dropout(x, 0.5).cpu()
    torch.manual_seed(2)
    assert torch.equal(torch.nn.functional.dropout(x, 0.5).cpu(), a)


def test_a_cpu_generator_is_refused_on_tpu():
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, device="tpu", generator=torch.Generator())
