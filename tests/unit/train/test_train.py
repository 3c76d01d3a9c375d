"""The trainer: the token clock sets the LR, a finished run resumes to its result, schedule-free
AdamW is evaluated at its averages, and the tasks learn (exact resume after a real SIGKILL:
tests/integration/train/test_train_kills.py)."""

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from schedule_search.core.config import parse
from schedule_search.tasks.registry import build_task
from schedule_search.train.config import TrainConfig
from schedule_search.train.launch import run_local

LINREG = {"name": "linreg", "dim": 64, "batch": 16}


def config(**sections) -> TrainConfig:
    base = {"task": LINREG, "budget": {"horizon": 1.0, "eval_at": [0.5]}}
    base.update(sections)
    return parse(TrainConfig, base, "test")


def window_lrs(run_dir: Path) -> list[float]:
    lines = (run_dir / "windows.jsonl").read_text().splitlines()
    return [json.loads(line)["lr"] for line in lines]


def test_lr_follows_the_token_clock_not_the_microbatch_count(tmp_path):
    schedule = {"kind": "poly", "warmup": 0.25, "gamma": 0.5, "alpha": 0.1}
    window = {"policy": "microbatches", "microbatches": 4}
    tokens_per_window = 4 * LINREG["batch"]
    per_window = config(
        schedule=schedule,
        window=window,
        budget={"horizon": 1.0, "eval_at": [], "tokens_per_reference_step": tokens_per_window},
    )
    run_local(per_window, tmp_path / "a")
    lrs = window_lrs(tmp_path / "a")

    task = build_task(LINREG, 0)
    steps_per_chinchilla = 20 * task.chinchilla_params(None) / tokens_per_window
    built = per_window.schedule.build(steps_per_chinchilla)
    peak = per_window.optimizer.lr
    assert len(lrs) > 10
    for n, lr in enumerate(lrs):  # after n windows, t = n reference steps (tokens / 64)
        assert lr == pytest.approx(peak * built(n), rel=1e-12)
    assert any(lr != pytest.approx(peak * built(4 * n)) for n, lr in enumerate(lrs)), (
        "counting micro-batches would give these; the test must tell them apart"
    )

    # The reference step is only the clock's unit: the LR each token sees does not change.
    per_microbatch = config(
        schedule=schedule, window=window, budget={"horizon": 1.0, "eval_at": []}
    )
    run_local(per_microbatch, tmp_path / "b")
    assert window_lrs(tmp_path / "b") == pytest.approx(lrs, rel=1e-12)


def test_linreg_excess_risk_falls(tmp_path):
    result = run_local(
        config(budget={"horizon": 4.0, "eval_at": [0.25, 0.5, 1, 2]}, optimizer={"lr": 0.01}),
        tmp_path,
    )
    risks = [row["val_loss"] for row in result.history]
    assert [row["chinchilla"] for row in result.history] == [0.25, 0.5, 1, 2, 4]
    assert all(b < a for a, b in itertools.pairwise(risks)), risks
    assert risks[-1] < 0.5 * risks[0]


def test_tinylm_beats_unigram_entropy_within_a_quarter_chinchilla(tmp_path):
    cfg = parse(
        TrainConfig, {"task": {"name": "tinylm"}, "budget": {"horizon": 0.25, "eval_at": []}}, "t"
    )
    result = run_local(cfg, tmp_path)
    entropy = build_task({"name": "tinylm"}, 0).unigram_entropy()
    final = result.final
    assert final["chinchilla"] == 0.25
    assert final["val_loss"] < entropy, (final["val_loss"], entropy)
    assert set(final) >= {
        "tokens",
        "val_loss_raw",
        "val_loss_ema/0.04",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "window_s",
        "microbatches",
        "wall_s",
    }


def test_resume_of_a_finished_run_reports_the_final_result_again(tmp_path):
    cfg = config()
    first = run_local(cfg, tmp_path)
    again = run_local(cfg, tmp_path)
    assert again.status == "completed" and again.history == first.history


def test_the_raw_weights_are_reported_even_when_the_bank_leaves_them_out(tmp_path):
    """Every record holds val_loss_raw; the objective `best` still picks among the bank's own
    fractions only, so the raw weights never win a bank that does not hold them."""
    bank = {"fractions": [0.16, 0.32], "objective": "best"}
    # A constant LR, so that the raw iterate wins some evaluations of the bank that holds it;
    # both runs share the seed, so every loss is the same number in both.
    lr = {"optimizer": {"lr": 0.05}, "schedule": {"kind": "constant", "warmup": 0.0}}
    result = run_local(config(ema=bank, **lr), tmp_path / "without")
    with_raw = run_local(
        config(ema={**bank, "fractions": [0.0, 0.16, 0.32]}, **lr), tmp_path / "with"
    )
    for row, full in zip(result.history, with_raw.history, strict=True):
        assert row["val_loss_raw"] == full["val_loss_raw"]
        assert row["ema_fraction"] in (0.16, 0.32)
        assert row["val_loss"] == min(full["val_loss_ema/0.16"], full["val_loss_ema/0.32"])
    assert any(full["ema_fraction"] == 0.0 for full in with_raw.history), (
        "with the raw weights in the bank they must win somewhere, or this test shows nothing"
    )


def test_schedule_free_is_evaluated_at_its_averaged_weights_and_trains_on(tmp_path):
    """Inside `evaluation_weights` the model holds schedule-free AdamW's averaged weights x,
    checked against the package's own reference implementation, which keeps x explicitly;
    after it the training point comes back bit for bit and the optimizer is in train mode."""
    from schedulefree import AdamWScheduleFreeReference

    from schedule_search.core.optimizer import OptimizerConfig, evaluation_weights

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    twin = torch.nn.Linear(8, 1)
    twin.load_state_dict(model.state_dict())
    optimizer = OptimizerConfig(name="schedulefree_adamw", lr=0.05).build(list(model.parameters()))
    reference = AdamWScheduleFreeReference(
        twin.parameters(), lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0
    )
    reference.train()
    for _ in range(25):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        for net, opt in ((model, optimizer), (twin, reference)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    training_point = [p.detach().clone() for p in model.parameters()]
    reference.eval()
    with evaluation_weights(optimizer):
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert not torch.equal(model.weight, training_point[0])
    assert optimizer.param_groups[0]["train_mode"]
    for p, saved in zip(model.parameters(), training_point, strict=True):
        assert torch.equal(p, saved)


@pytest.mark.parametrize("optimizer", ["adamw", "schedulefree_adamw"])
def test_evaluating_more_often_leaves_the_run_unchanged(tmp_path, optimizer):
    """An evaluation is read-only: the held-out sample has generators of its own, and the EMA
    members and schedule-free's averaged weights are swapped in and out bit for bit. So a space
    may evaluate between ASHA's rungs (the default's 3x) without moving what the rungs see: the
    same run evaluated at 0.5x alone and at 0.25x, 0.5x and 0.75x ends in the same state and
    scores the same at the milestones both have."""
    from schedule_search.core import checkpoint as ckpt

    sections = {
        "optimizer": {"name": optimizer, "lr": 0.05},
        "schedule": {"kind": "constant", "warmup": 0.1},
        "ema": {"fractions": [0.0, 0.04, 0.16], "objective": "best"},
    }
    sparse = run_local(config(**sections), tmp_path / "sparse")
    dense_config = config(**sections, budget={"horizon": 1.0, "eval_at": [0.25, 0.5, 0.75]})
    dense = run_local(dense_config, tmp_path / "dense")
    assert [row["chinchilla"] for row in dense.history] == [0.25, 0.5, 0.75, 1.0]
    shared = {row["chinchilla"]: row for row in dense.history}
    for row in sparse.history:
        assert shared[row["chinchilla"]]["val_loss"] == row["val_loss"]
        assert shared[row["chinchilla"]]["val_loss_raw"] == row["val_loss_raw"]
    ends = [ckpt.load_latest(tmp_path / run / "checkpoints")[1] for run in ("sparse", "dense")]
    for name, tensor in ends[0]["model"].items():
        assert torch.equal(tensor, ends[1]["model"][name]), name
    for fraction, averages in ends[0]["ema"]["averages"].items():
        others = ends[1]["ema"]["averages"][fraction]
        assert all(torch.equal(a, b) for a, b in zip(averages, others, strict=True)), fraction


def test_a_schedule_free_run_reports_its_averaged_weights_loss(tmp_path):
    cfg = config(
        optimizer={"name": "schedulefree_adamw", "lr": 0.05},
        schedule={"kind": "constant", "warmup": 0.1},
        ema={"fractions": [0.0], "objective": 0.0},
    )
    result = run_local(cfg, tmp_path)
    assert result.status == "completed"
    losses = [row["val_loss"] for row in result.history]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
