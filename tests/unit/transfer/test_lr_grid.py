"""Envelope grids that find their optimum, on synthetic loss tables."""

import math

from schedule_search.transfer.lr_grid import grid_state

START = (0.5, 1.0, 2.0)


def run_grid(loss_of, max_extensions=3):
    """Drive the grid to the end against a synthetic loss function; return the runs and the
    final state."""
    losses = {}
    while (state := grid_state(START, losses, max_extensions)).next_lr is not None:
        assert state.next_lr not in losses, "no LR is run twice"
        losses[state.next_lr] = loss_of(state.next_lr)
    return losses, state


def test_an_interior_best_needs_no_extension():
    losses, state = run_grid(lambda lr: (math.log2(lr) - 0.2) ** 2)
    assert sorted(losses) == list(START)
    assert state.interior and state.best_lr == 1.0 and state.bound_hit is None


def test_a_best_at_the_high_edge_is_extended_until_interior():
    losses, state = run_grid(lambda lr: (math.log2(lr) - 2.6) ** 2)  # optimum near 6
    assert sorted(losses) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert state.interior and state.best_lr == 8.0 and state.bound_hit is None


def test_a_best_at_the_low_edge_is_extended_downwards():
    losses, state = run_grid(lambda lr: (math.log2(lr) + 2.2) ** 2)  # optimum near 0.22
    assert sorted(losses) == [0.125, 0.25, 0.5, 1.0, 2.0]
    assert state.interior and state.best_lr == 0.25


def test_the_bound_is_hit_and_marked():
    losses, state = run_grid(lambda lr: -lr, max_extensions=2)  # always better higher
    assert sorted(losses) == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert not state.interior and state.bound_hit == "high" and state.best_lr == 8.0


def test_diverged_runs_count_as_worst():
    losses, state = run_grid(lambda lr: math.nan if lr >= 2.0 else -lr)
    assert sorted(losses) == list(START)
    assert state.interior and state.best_lr == 1.0


def test_start_points_run_first_in_order():
    state = grid_state(START, {}, 3)
    assert state.next_lr == 0.5 and state.best_lr is None and not state.interior
    state = grid_state(START, {0.5: 1.0, 2.0: 0.5}, 3)
    assert state.next_lr == 1.0
