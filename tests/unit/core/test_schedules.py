"""Schedules against the formulas of the contract, written out again independently here."""

import dataclasses
import math

import pytest

from schedule_search.core.config import ConfigError, parse
from schedule_search.core.schedules import Constant, Cosine, Poly, ScheduleConfig, Warmup, Wsd


def reference(kind: str, t: float, W: float, gamma=0.5, alpha=10.0, T=1000.0, floor=0.1, frac=0.1):
    warm = 0.1 + 0.9 * min(t, W) / W if W > 0 else 1.0
    if t < W:
        return warm
    if kind == "constant":
        return 1.0
    if kind == "poly":
        return (alpha / (t - W + alpha)) ** gamma
    if kind == "cosine":
        s = min(t, T)
        return floor + (1 - floor) * (1 + math.cos(math.pi * (s - W) / (T - W))) / 2
    start = (1 - frac) * T
    if t <= start:
        return 1.0
    return 1.0 - (1.0 - floor) * min((t - start) / (frac * T), 1.0)


W = 50.0
GRID = sorted(
    {0.0, 1e-9, W - 1e-9, W, W + 1e-9, 899.999, 900.0, 900.001, 999.999, 1000.0, 1000.001, 1e4}
    | {i * 7.3 for i in range(200)}
)
SCHEDULES = {
    "constant": Constant(Warmup(W)),
    "poly": Poly(Warmup(W), 0.5, 10.0),
    "cosine": Cosine(Warmup(W), 1000.0, 0.1),
    "wsd": Wsd(Warmup(W), 1000.0, 0.1, 0.1),
}


@pytest.mark.parametrize("kind", SCHEDULES)
def test_schedule_equals_design_formula_on_grid(kind):
    schedule = SCHEDULES[kind]
    for t in GRID:
        assert schedule(t) == pytest.approx(reference(kind, t, W), abs=1e-12, rel=0), t


@pytest.mark.parametrize("gamma", [0.0, 0.25, 0.5, 1.0])
def test_poly_gamma_family(gamma):
    schedule = Poly(Warmup(W), gamma, 37.0)
    for t in GRID:
        assert schedule(t) == pytest.approx(
            reference("poly", t, W, gamma=gamma, alpha=37.0), abs=1e-12
        )


def test_warmup_boundaries_are_continuous():
    for schedule in SCHEDULES.values():
        assert schedule(0.0) == pytest.approx(0.1, abs=1e-12)
        assert schedule(W) == pytest.approx(1.0, abs=1e-12)
        assert schedule(W - 1e-9) == pytest.approx(1.0, abs=1e-9)


def test_no_warmup_starts_at_peak():
    assert Poly(Warmup(0.0), 0.5, 10.0)(0.0) == 1.0
    assert Constant(Warmup(0.0))(0.0) == 1.0


def test_horizon_free_schedules_have_no_horizon_to_read():
    for cls in (Constant, Poly):
        assert "horizon" not in {f.name for f in dataclasses.fields(cls)}
    # A horizon in the config is ignored by constant and poly: values identical for any horizon.
    for kind in ("constant", "poly"):
        a = ScheduleConfig(kind=kind, horizon=2.0).build(1000.0)
        b = ScheduleConfig(kind=kind, horizon=64.0).build(1000.0)
        c = ScheduleConfig(kind=kind).build(1000.0)
        assert a == c and b == c


def test_config_converts_chinchilla_multiples_to_steps():
    schedule = ScheduleConfig(kind="cosine", warmup=0.1, horizon=4.0, floor=0.2).build(250.0)
    assert schedule == Cosine(Warmup(25.0), 1000.0, 0.2)
    wsd = ScheduleConfig(kind="wsd", warmup=0.0, horizon=2.0, decay_fraction=0.2).build(100.0)
    assert wsd.branch_point == pytest.approx(160.0)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"kind": "cosine"}, "horizon: required"),
        ({"kind": "wsd", "horizon": 0.01, "warmup": 0.05}, "horizon: must exceed warmup"),
        (  # the cooldown from (1 - 0.95) * 4 = 0.2 would start inside the 0.4x warmup
            {"kind": "wsd", "horizon": 4.0, "warmup": 0.4, "decay_fraction": 0.95},
            r"schedule\.decay_fraction: 0.95 of horizon 4 starts the cooldown at 0.2, inside the "
            r"warmup \(0.4\); expected at most 0.9",
        ),
        ({"kind": "exponential"}, "kind"),
        ({"gamma": -1}, "gamma"),
        ({"floor": 1.5}, "floor"),
        ({"alpha": 0}, "alpha"),
        ({"gama": 0.5}, "gama: unknown key"),
    ],
)
def test_bad_schedule_config_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse(ScheduleConfig, data, "space.yaml", "schedule")
    assert str(err.value).startswith("space.yaml: schedule")
    assert "\n" not in str(err.value)


def d2z_reference(t: float, W: float, T: float) -> float:
    """Linear decay to zero, written out again."""
    if t < W:
        return 0.1 + 0.9 * t / W
    return max(0.0, 1.0 - (t - W) / (T - W))


def sqrt_cooldown_reference(t: float, W: float, T: float, f: float) -> float:
    """WSD with the (1 - sqrt) cooldown over the last f of T."""
    if t < W:
        return 0.1 + 0.9 * t / W
    t0 = (1 - f) * T
    if t <= t0:
        return 1.0
    return 1.0 - math.sqrt(min((t - t0) / (T - t0), 1.0))


def test_linear_to_zero_equals_its_formula_and_reaches_exactly_zero_at_T():
    schedule = ScheduleConfig(kind="linear", warmup=0.05, horizon=1.0).build(1000.0)
    for t in GRID:
        assert schedule(t) == pytest.approx(d2z_reference(t, W, 1000.0), abs=1e-12, rel=0), t
    assert schedule(1000.0) == 0.0 and schedule(1e4) == 0.0
    assert schedule(999.999) > 0.0


@pytest.mark.parametrize("f", [0.1, 0.2])
def test_wsd_sqrt_cooldown_equals_its_formula_and_reaches_exactly_zero_at_T(f):
    config = ScheduleConfig(kind="wsd", warmup=0.05, horizon=1.0, decay_fraction=f, cooldown="sqrt")
    schedule = config.build(1000.0)
    for t in GRID:
        assert schedule(t) == pytest.approx(
            sqrt_cooldown_reference(t, W, 1000.0, f), abs=1e-12, rel=0
        ), t
    assert schedule(1000.0) == 0.0 and schedule(2000.0) == 0.0
    # Faster than linear early in the cooldown, the shape Hagele et al. found better.
    t = (1 - f) * 1000.0 + 0.25 * f * 1000.0
    assert schedule(t) == pytest.approx(0.5) and schedule(t) < 1 - 0.9 * 0.25
    # The linear cooldown is unchanged.
    linear = ScheduleConfig(kind="wsd", warmup=0.05, horizon=1.0, decay_fraction=f).build(1000.0)
    assert linear(1000.0) == pytest.approx(0.1)


def test_the_largest_decay_fraction_a_refusal_names_is_accepted():
    with pytest.raises(ConfigError, match=r"expected at most 0\.866666") as err:
        parse(ScheduleConfig, {"kind": "wsd", "horizon": 3.0, "decay_fraction": 0.9}, "x", "s")
    most = float(str(err.value).rsplit(" ", 1)[1])
    ScheduleConfig(kind="wsd", warmup=0.4, horizon=3.0, decay_fraction=most)


def test_the_longest_wsd_cooldown_starts_where_the_warmup_ends_without_a_jump():
    # (1 - 0.9) * 4 is 0.3999... in floating point: the warmup's end, not inside it.
    config = ScheduleConfig(kind="wsd", warmup=0.4, horizon=4.0, decay_fraction=0.9)
    schedule = config.build(100.0)
    assert schedule(39.999) == pytest.approx(1.0, abs=1e-4)
    assert schedule(40.001) == pytest.approx(1.0, abs=1e-4)
    assert schedule(400.0) == pytest.approx(0.1)


def test_linear_needs_a_horizon():
    with pytest.raises(ConfigError, match=r"schedule\.horizon: required"):
        parse(ScheduleConfig, {"kind": "linear"}, "x.yaml", "schedule")
