"""Tasks and their data: the embedded corpus, the user's text and token files, user tasks."""

import numpy as np
import pytest
import torch

from schedule_search.config import ConfigError
from schedule_search.tasks import Microbatch, Task, build_task, corpus


def test_embedded_corpus_is_deterministic_and_split():
    a = build_task({"name": "tinylm", "max_bytes": 300_000}, seed=0)
    b = build_task({"name": "tinylm", "max_bytes": 300_000}, seed=0)
    assert np.array_equal(a.corpus.train, b.corpus.train)
    assert np.array_equal(a.corpus.val, b.corpus.val)
    assert len(a.corpus.train) + len(a.corpus.val) == 300_000
    assert 0.05 < len(a.corpus.val) / 300_000 < 0.2
    assert "stdlib" in a.corpus.description


def test_microbatches_depend_only_on_seed_rank_and_index():
    task = build_task({"name": "tinylm", "max_bytes": 200_000}, seed=3)
    first = task.microbatch(7, 1, 2)
    assert torch.equal(first.data, task.microbatch(7, 1, 2).data)
    assert not torch.equal(first.data, task.microbatch(7, 0, 2).data)
    assert not torch.equal(first.data, task.microbatch(8, 1, 2).data)
    assert first.tokens == task.tokens_per_microbatch


def test_text_folder(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 2000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("more text\n" * 2000)
    task = build_task({"name": "tinylm", "data": str(tmp_path), "context": 16}, seed=0)
    assert task.corpus.vocab_size == 256
    assert len(task.corpus.train) + len(task.corpus.val) == 24000 + 20000


def test_token_bin_in_nanogpt_layout(tmp_path):
    rng = np.random.default_rng(0)
    rng.integers(0, 1000, 5000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    rng.integers(0, 1000, 800, dtype=np.uint16).tofile(tmp_path / "val.bin")
    task = build_task({"name": "tinylm", "data": str(tmp_path), "vocab_size": 1024}, seed=0)
    assert task.corpus.vocab_size == 1024 and len(task.corpus.val) == 800
    model = task.build_model()
    loss = task.loss_sum(model, task.microbatch(0, 0, 1))
    assert loss.shape == () and torch.isfinite(loss)
    single = tmp_path / "all.bin"
    rng.integers(0, 50, 4000, dtype=np.uint16).tofile(single)
    inferred = build_task({"name": "tinylm", "data": str(single), "context": 8}, seed=0)
    assert inferred.corpus.vocab_size <= 50


@pytest.mark.parametrize(
    "setup, options, message",
    [
        (lambda p: None, {"data": "{p}/missing"}, "task.data: path not found"),
        (lambda p: (p / "empty").mkdir(), {"data": "{p}/empty"}, "holds no text"),
        (lambda p: (p / "t.txt").write_text("ab"), {"data": "{p}/t.txt"}, "too short"),
        (
            lambda p: (p / "odd.bin").write_bytes(b"abc"),
            {"data": "{p}/odd.bin"},
            "not a uint16 token file",
        ),
        (
            lambda p: np.array([5, 900], dtype=np.uint16).repeat(100).tofile(p / "v.bin"),
            {"data": "{p}/v.bin", "vocab_size": 256, "context": 4},
            "task.vocab_size",
        ),
        (lambda p: None, {"d_model": 30}, "task.n_head"),
        (lambda p: None, {"context": 0}, "task.context"),
        (lambda p: None, {"layers": 2}, "task.layers: unknown key"),
    ],
)
def test_bad_data_and_options_are_one_line_errors(tmp_path, setup, options, message):
    setup(tmp_path)
    options = {k: v.format(p=tmp_path) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(ConfigError, match=message) as err:
        build_task({"name": "tinylm", **options}, seed=0, source="run.yaml")
    assert str(err.value).startswith("run.yaml: task") and "\n" not in str(err.value)


class ConstantTask:
    """A user task: fit a constant to noisy targets."""

    def __init__(self, seed: int, scale: float = 1.0) -> None:
        self.seed, self.scale = seed, scale
        self.tokens_per_microbatch = 8

    def build_model(self):
        return torch.nn.Linear(1, 1, bias=False)

    def chinchilla_params(self, model):
        return 1

    def microbatch(self, index, rank, world_size):
        g = torch.Generator().manual_seed(self.seed * 100_000 + index * 10 + rank)
        return Microbatch(self.scale + torch.randn(8, generator=g), 8)

    def loss_sum(self, model, batch):
        return ((model.weight.squeeze() - batch.data) ** 2).sum()

    def evaluate(self, model):
        return float((model.weight.squeeze() - self.scale) ** 2)


def make_constant_task(seed: int, scale: float = 1.0) -> ConstantTask:
    return ConstantTask(seed, scale)


def test_user_task_by_module_and_factory():
    task = build_task({"name": "test_tasks:make_constant_task", "scale": 2.0}, seed=1)
    assert isinstance(task, Task) and task.scale == 2.0


@pytest.mark.parametrize(
    "name, message",
    [
        ("nosuchmodule_xyz:factory", "cannot import"),
        ("test_tasks:missing", "has no callable"),
        ("test_tasks", "expected one of linreg, tinylm"),
        ("test_tasks:ConstantTask.__doc__", "has no callable"),
    ],
)
def test_bad_user_task_names(name, message):
    with pytest.raises(ConfigError, match=message):
        build_task({"name": name}, seed=0)


def test_user_task_refusing_its_options():
    with pytest.raises(ConfigError, match="refused its options"):
        build_task({"name": "test_tasks:make_constant_task", "colour": "red"}, seed=0)


def test_unigram_entropy():
    assert corpus.unigram_entropy(np.array([0, 1, 0, 1]), 256) == pytest.approx(np.log(2))
