"""Cost: arithmetic and ordering of valid, invalid and unknown costs; Device."""

import math

import pytest

from collage.measuring.cost import Cost, CostSource, Device


def test_valid_cost_keeps_its_measurement():
    c = Cost.of(1.5, spread=0.1, samples=20)
    assert c.is_valid and not c.is_invalid and not c.is_unknown
    assert (c.value_ms, c.spread_ms, c.samples, c.reason) == (1.5, 0.1, 20, None)


def test_invalid_cost_is_infinite_with_its_reason():
    c = Cost.invalid("compile failed: conv2d groups=3")
    assert c.is_invalid and not c.is_valid
    assert c.value_ms == math.inf
    assert c.reason == "compile failed: conv2d groups=3"
    assert "conv2d groups=3" in str(c)


def test_unknown_cost_has_no_value():
    c = Cost.unknown()
    assert c.is_unknown and not c.is_valid and not c.is_invalid
    with pytest.raises(ValueError, match="unknown"):
        c.value_ms


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_a_valid_cost_needs_a_finite_non_negative_median(bad):
    with pytest.raises(ValueError):
        Cost.of(bad)


def test_an_invalid_cost_needs_a_reason():
    with pytest.raises(ValueError):
        Cost.invalid("")


def test_valid_costs_add_up():
    total = Cost.of(1.0, spread=0.1, samples=10) + Cost.of(2.5, spread=0.2, samples=10)
    assert total.is_valid
    assert total.value_ms == pytest.approx(3.5)
    assert total.spread_ms == pytest.approx(0.3)
    assert total.samples == 0  # a sum is not one measurement


def test_invalid_absorbs_everything_and_keeps_the_first_reason():
    bad, worse = Cost.invalid("first"), Cost.invalid("second")
    assert (Cost.of(1.0) + bad).reason == "first"
    assert (bad + Cost.of(1.0)).reason == "first"
    assert (bad + worse).reason == "first"
    assert (Cost.unknown() + bad).is_invalid
    assert (bad + Cost.unknown()).is_invalid


def test_unknown_absorbs_valid_costs():
    assert (Cost.of(1.0) + Cost.unknown()).is_unknown
    assert (Cost.unknown() + Cost.of(1.0)).is_unknown


def test_sum_of_costs():
    assert sum([Cost.of(1.0), Cost.of(2.0), Cost.of(3.0)]).value_ms == pytest.approx(6.0)
    assert sum([Cost.of(1.0), Cost.invalid("x")]).is_invalid


def test_costs_order_by_value_with_invalid_last():
    cheap, dear, bad = Cost.of(1.0), Cost.of(2.0), Cost.invalid("no")
    assert cheap < dear < bad
    assert bad > dear >= dear and cheap <= cheap
    assert min([bad, dear, cheap]) is cheap
    assert sorted([bad, cheap, dear]) == [cheap, dear, bad]


def test_unknown_costs_cannot_be_ordered():
    with pytest.raises(ValueError, match="unknown"):
        Cost.unknown() < Cost.of(1.0)
    with pytest.raises(ValueError, match="unknown"):
        min([Cost.of(1.0), Cost.unknown()])


def test_costs_are_frozen_values():
    assert Cost.of(1.0, samples=3) == Cost.of(1.0, samples=3)
    assert Cost.invalid("a") != Cost.invalid("b")
    assert len({Cost.of(1.0), Cost.of(1.0)}) == 1
    with pytest.raises(AttributeError):
        Cost.of(1.0).median_ms = 2.0


class PriceList:
    """A test-only cost source: a price per op for each backend, invalid for the rest."""

    def __init__(self, prices):
        self.prices = prices

    def cost(self, candidate) -> Cost:
        price = self.prices.get(candidate.backend)
        if price is None:
            return Cost.invalid(f"no price for {candidate.backend}")
        return Cost.of(price * candidate.size)


def test_a_test_only_source_serves_as_a_cost_source():
    from types import SimpleNamespace

    source: CostSource = PriceList({"tvm": 2.0, "dnnl": 1.0})
    candidates = [SimpleNamespace(backend=b, size=3) for b in ("tvm", "dnnl", "mkl")]
    costs = {c.backend: source.cost(c) for c in candidates}
    assert min(costs.values()) == Cost.of(3.0)
    assert costs["mkl"].reason == "no price for mkl"


def test_this_machine_names_the_cpu_and_threads():
    device = Device.this_machine(threads=4)
    assert device.name and device.name.strip() == device.name
    assert device.threads == 4
    assert Device.this_machine(threads=4) == device
    assert Device.this_machine(threads=1) != device


def test_device_rejects_bad_records():
    with pytest.raises(ValueError):
        Device("some CPU", 0)
    with pytest.raises(ValueError):
        Device("", 4)
    with pytest.raises(ValueError, match="unknown target"):
        Device.this_machine(threads=1, target="vulkan")


def test_cuda_device_needs_a_gpu():
    import tvm

    if tvm.cuda(0).exist:
        assert Device.this_machine(threads=1, target="cuda").name == tvm.cuda(0).device_name
    else:
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            Device.this_machine(threads=1, target="cuda")
