"""The energy meters read real counters: RAPL through a powercap tree laid out as Linux lays it
out, NVML where an NVIDIA GPU and nvidia-ml-py are present. None is invented where there is none."""

import time

import pytest

from collage.measuring.meters import NoEnergyMeter, energy_meter, nvml, rapl


def _zone(root, name, energy_uj, max_uj=2**32):
    zone = root / name
    zone.mkdir()
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_sums_the_package_zones_and_corrects_a_wrapped_counter(tmp_path):
    first, second = _zone(tmp_path, "intel-rapl:0", 1_000_000), _zone(tmp_path, "intel-rapl:1", 5_000_000, max_uj=10_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 7)  # a sub-zone (core) inside package 0: counted in it already
    meter = rapl(str(tmp_path))
    assert meter.domains == (str(first), str(second))
    before = meter.read()
    (first / "energy_uj").write_text("3000000\n")  # +2 J
    (second / "energy_uj").write_text("1000000\n")  # wrapped: 5 J to the top, then 1 J
    assert meter.joules(before, meter.read()) == pytest.approx(2.0 + 6.0)


def test_no_rapl_is_one_clear_reason(tmp_path):
    with pytest.raises(NoEnergyMeter, match="does not exist"):
        rapl(str(tmp_path / "absent"))
    with pytest.raises(NoEnergyMeter, match="has no rapl package zone"):
        rapl(str(tmp_path))


def test_nvml_counts_a_gpus_energy_where_there_is_one():
    try:
        meter = nvml()
    except NoEnergyMeter as why:
        pytest.skip(str(why))
    assert energy_meter("cuda") == meter
    before = meter.read()
    time.sleep(0.5)  # an idle GPU still draws tens of watts
    joules = meter.joules(before, meter.read())
    assert 0 < joules < 0.5 * 1000  # at most 1 kW
