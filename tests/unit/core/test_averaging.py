"""The EMA bank against torch's own AveragedModel, driven with the same per-update decays."""

import random

import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from schedule_search.core.averaging import EmaBank, EmaConfig, ema_decay
from schedule_search.core.config import ConfigError, parse

FRACTIONS = [0.0, 0.01, 0.04, 0.16]


def test_decay_matches_the_paper_with_unit_steps():
    # tau_t = 0.5 ** (f / (t + 1)) with f = 1 / frac
    for t in range(50):
        assert ema_decay(t, t + 1, 0.04) == pytest.approx(0.5 ** (25 / (t + 1)), rel=1e-12)


@pytest.mark.parametrize(
    "dtype, step, tolerance",
    # float32 with optimizer-step-sized moves: the 1e-6. float64 with large moves shows
    # the update rule itself is exact and any float32 gap is rounding.
    [(torch.float32, 0.01, 1e-6), (torch.float64, 0.1, 1e-12)],
)
def test_bank_equals_averaged_model_with_uneven_clock(dtype, step, tolerance):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = model.to(dtype)
    bank = EmaBank(list(model.parameters()), FRACTIONS)
    references = {}
    decay = {"value": 0.0}
    for frac in FRACTIONS:
        references[frac] = AveragedModel(
            model, avg_fn=lambda avg, new, n: decay["value"] * avg + (1 - decay["value"]) * new
        )
    rng = random.Random(1)
    t = 0.0
    for _ in range(200):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * step)
        t0, t = t, t + rng.uniform(0.1, 7.0)  # uneven clock increments
        bank.update(t)
        for frac, reference in references.items():
            decay["value"] = ema_decay(t0, t, frac)
            reference.update_parameters(model)
    for frac, reference in references.items():
        for mine, theirs in zip(bank.weights(frac), reference.module.parameters(), strict=True):
            torch.testing.assert_close(mine, theirs.detach(), atol=tolerance, rtol=0)
    # frac = 0 is the raw weights; larger fractions average longer (differ more from raw).
    raw = torch.cat([p.detach().flatten() for p in model.parameters()])
    gaps = [
        float((torch.cat([w.flatten() for w in bank.weights(f)]) - raw).norm()) for f in FRACTIONS
    ]
    assert gaps[0] == 0 and gaps[1] < gaps[2] < gaps[3]


def test_swapped_in_restores_raw_weights():
    model = torch.nn.Linear(4, 2)
    bank = EmaBank(list(model.parameters()), [0.1])
    with torch.no_grad():
        model.weight.add_(1.0)
    bank.update(1.0)
    bank.update(2.0)
    raw = model.weight.detach().clone()
    with bank.swapped_in(0.1):
        assert torch.equal(model.weight, bank.weights(0.1)[0])
        assert not torch.equal(model.weight, raw)
    assert torch.equal(model.weight, raw)


def test_state_dict_round_trip():
    model = torch.nn.Linear(4, 2)
    bank = EmaBank(list(model.parameters()), [0.01, 0.1])
    bank.update(3.0)
    other = EmaBank(list(torch.nn.Linear(4, 2).parameters()), [0.01, 0.1])
    other.load_state_dict(bank.state_dict())
    assert other.t == 3.0
    for frac in (0.01, 0.1):
        for a, b in zip(other.weights(frac), bank.weights(frac), strict=True):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="fractions differ"):
        EmaBank(list(model.parameters()), [0.5]).load_state_dict(bank.state_dict())


def test_objective_must_be_a_kept_fraction():
    with pytest.raises(ConfigError, match=r"ema\.objective"):
        parse(EmaConfig, {"fractions": [0.0, 0.1], "objective": 0.04}, "x.yaml", "ema")
