"""Tasks and their data: the embedded corpus, the user's text and token files, user tasks."""

import numpy as np
import pytest
import torch

from schedule_search.core.config import ConfigError
from schedule_search.tasks import corpus
from schedule_search.tasks.protocol import Microbatch, Task, seeded_generator
from schedule_search.tasks.registry import build_task


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


def test_every_seed_is_evaluated_on_one_held_out_sample():
    """A seed changes initialization and data order, not the yardstick: one model scores the
    same whatever the task's seed, on the spans seed 0's runs always drew."""
    options = {"name": "tinylm", "max_bytes": 200_000, "eval_batches": 3}
    tasks = [build_task(options, seed=seed) for seed in (0, 1, 5)]
    model = tasks[1].build_model()
    seed_0s = seed_0s_spans_loss(tasks[0], model)
    assert [task.evaluate(model) for task in tasks] == [pytest.approx(seed_0s, rel=1e-6)] * 3
    assert tasks[1].held_out_loss(model, 1) != pytest.approx(seed_0s, rel=1e-6)  # other spans
    assert not torch.equal(tasks[0].microbatch(0, 0, 1).data, tasks[1].microbatch(0, 0, 1).data)


def seed_0s_spans_loss(task, model) -> float:
    """The loss on the spans seed 0's runs always drew (keys 0, 0, i, 1), by hand."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(task.config.eval_batches):
            rows = task._sample_rows(task.corpus.val, seeded_generator(0, 0, i, 1))
            batch = Microbatch(rows, rows.shape[0] * task.config.context)
            total += float(task.loss_sum(model, batch))
            count += batch.tokens
    return total / count


@pytest.mark.parametrize("name", ["tinylm", "linreg"])
def test_a_windows_data_does_not_depend_on_how_many_ranks_share_it(name):
    """Window w of 1 rank x 4 micro-batches, 2 ranks x 2 and 4 ranks x 1 hold the same draws
    of one stream, in the same order (rank-major within each micro-batch index)."""
    options = {"name": name, "max_bytes": 200_000} if name == "tinylm" else {"name": name}
    task = build_task(options, seed=3)
    for window in range(3):
        one = [task.microbatch(4 * window + k, 0, 1).data for k in range(4)]
        for ranks in (2, 4):
            per_rank = 4 // ranks
            split = [
                task.microbatch(per_rank * window + k, r, ranks).data
                for k in range(per_rank)
                for r in range(ranks)
            ]
            assert len(split) == len(one)
            for a, b in zip(one, split, strict=True):
                if name == "linreg":
                    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
                else:
                    assert torch.equal(a, b)


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


def masked_split(stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The split by its definition: a mask over the whole stream (what `_split` must equal)."""
    held_out = np.zeros(len(stream), dtype=bool)
    for block in range(corpus.HELD_OUT_EVERY - 1, -(-len(stream) // corpus.BLOCK), 10):
        held_out[block * corpus.BLOCK : (block + 1) * corpus.BLOCK] = True
    if not held_out.any():
        held_out[len(stream) - max(len(stream) // corpus.HELD_OUT_EVERY, 1) :] = True
    return stream[~held_out], stream[held_out]


@pytest.mark.parametrize(
    "size", [50, 9 * corpus.BLOCK + 7, 10 * corpus.BLOCK, 23 * corpus.BLOCK + 1]
)
def test_split_views_read_exactly_the_masked_split(size):
    stream = np.random.default_rng(size).integers(0, 60_000, size, dtype=np.uint16)
    for view, expected in zip(corpus._split(stream), masked_split(stream), strict=True):
        assert len(view) == len(expected)
        assert np.array_equal(np.asarray(view), expected)
        rng = np.random.default_rng(0)
        for start in rng.integers(0, len(expected), 200):  # spans across held-out gaps too
            stop = min(int(start) + int(rng.integers(1, 3 * corpus.BLOCK)), len(expected))
            assert np.array_equal(view[int(start) : stop], expected[start:stop])
        assert view.max() == expected.max()
        assert corpus.unigram_entropy(view, 60_000) == pytest.approx(
            corpus.unigram_entropy(expected, 60_000), rel=1e-12
        )


def anonymous_memory_bytes() -> int:
    """This process's private memory (RssAnon): what a copy of the data would add; the pages
    of a memory-mapped file are the page cache's, not the process's."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_a_large_token_file_is_read_in_place(tmp_path):
    """128 MiB of tokens: building the task, sampling micro-batches and evaluating add a few
    MiB of private memory, not a copy of the file (a mask and a copy would add ~190 MiB)."""
    path = tmp_path / "big.bin"
    tokens = 64 * 1024 * 1024
    with open(path, "wb") as handle:
        block = np.arange(corpus.BLOCK, dtype=np.uint16) % 1000
        for _ in range(tokens // corpus.BLOCK):
            handle.write(block.tobytes())
    del block
    before = anonymous_memory_bytes()
    task = build_task({"name": "tinylm", "data": str(path), "context": 32, "batch": 4}, seed=0)
    for index in range(20):
        task.microbatch(index, 0, 1)
    grown = anonymous_memory_bytes() - before
    assert len(task.corpus.train) + len(task.corpus.val) == tokens
    assert grown < 16 * 1024 * 1024, f"private memory grew by {grown / 2**20:.0f} MiB"
