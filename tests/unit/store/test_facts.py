"""The facts a sweep's launch resolves once, and what every later verb reads instead of the
space and the task."""

import json

import pytest

from schedule_search.core.config import ConfigError
from schedule_search.store.facts import FACTS_FILE, read_facts, write_facts
from schedule_search.sweep.resolve import resolve_facts
from schedule_search.sweep.space import SearchSpace, trial_config
from schedule_search.tasks.registry import build_task


def test_facts_count_the_model_the_trials_train_without_allocating_it(tmp_path):
    space = SearchSpace(
        base={"task": {"name": "tinylm", "d_model": 32}, "budget": {"horizon": 2.0}},
        params={},
    )
    facts = resolve_facts(space, "space.yaml")
    task = build_task(trial_config(space, {}).task, 0)
    model = task.build_model()
    assert facts.n_params == task.chinchilla_params(model) > 0
    assert facts.tokens_per_reference_step == task.tokens_per_microbatch
    assert facts.horizon == 2.0 and facts.milestones[-1] == 2.0
    assert facts.tokens_per_param == 20.0
    write_facts(tmp_path, facts)
    assert read_facts(tmp_path) == facts


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, "facts.json: unreadable sweep facts"),
        ("{", "unreadable sweep facts"),
        ('{"x": 1}', "facts.json: "),
    ],
)
def test_missing_or_damaged_facts_are_one_line(tmp_path, text, expected):
    if text is not None:
        (tmp_path / FACTS_FILE).write_text(text)
    with pytest.raises(ConfigError, match=expected) as raised:
        read_facts(tmp_path)
    assert "\n" not in str(raised.value)


def test_facts_are_plain_json_a_reader_can_audit(tmp_path):
    space = SearchSpace(base={"task": {"name": "linreg", "dim": 16}}, params={})
    write_facts(tmp_path, resolve_facts(space, "space.yaml"))
    recorded = json.loads((tmp_path / FACTS_FILE).read_text())
    assert recorded["n_params"] == 16 and recorded["horizon"] == 4.0
