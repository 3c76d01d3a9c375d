"""Token streams for tinylm: the embedded corpus, a folder of text, or uint16 token files.

The embedded default is Python's own standard-library sources, present on every machine with no
download. Text is read as bytes (a byte-level vocabulary of 256). Token files follow nanoGPT's
layout: a flat array of uint16, either one `.bin` file or a folder with `train.bin` and
`val.bin`. Without a separate validation file the split is deterministic: every tenth block of
64 Ki tokens is held out. Token files stay memory-mapped: a split is a view of the file's
blocks (`Pieces`), so memory does not grow with the file (nanoGPT slices its memmap the same way).
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedule_search.core.config import ConfigError

__all__ = [
    "BLOCK",
    "HELD_OUT_EVERY",
    "Corpus",
    "Pieces",
    "embedded",
    "load",
    "stdlib_files",
    "unigram_entropy",
]

BLOCK = 1 << 16
HELD_OUT_EVERY = 10


class Pieces:
    """Ranges of a token stream read as one sequence, without copying the stream.

    `pieces[a:b]` copies only the tokens asked for, so a split of a memory-mapped file of any
    size costs its list of ranges; the tokens are exactly those of the ranges concatenated.
    """

    def __init__(self, stream: np.ndarray, ranges: list[tuple[int, int]]) -> None:
        self.stream = stream
        self.ranges = [(a, b) for a, b in ranges if b > a]
        self._offsets = np.cumsum([0] + [b - a for a, b in self.ranges])

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("Pieces take contiguous slices only")
        parts = []
        piece = int(np.searchsorted(self._offsets, start, side="right")) - 1
        while start < stop:
            first, last = self.ranges[piece]
            begin = first + start - int(self._offsets[piece])
            end = min(last, begin + stop - start)
            parts.append(self.stream[begin:end])
            start += end - begin
            piece += 1
        return np.concatenate(parts) if parts else self.stream[0:0]

    def chunks(self) -> Iterator[np.ndarray]:
        """The ranges, one array view at a time (what a scan over the split reads)."""
        for a, b in self.ranges:
            yield self.stream[a:b]

    def max(self, initial: int = 0) -> int:
        return max((int(chunk.max()) for chunk in self.chunks()), default=initial)

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        whole = np.concatenate(list(self.chunks())) if self.ranges else self.stream[0:0]
        return whole if dtype is None else whole.astype(dtype)


@dataclass(frozen=True)
class Corpus:
    train: Pieces
    val: Pieces
    vocab_size: int
    description: str


def _split(stream: np.ndarray) -> tuple[Pieces, Pieces]:
    """Every HELD_OUT_EVERY-th block of BLOCK tokens goes to validation."""
    n = len(stream)
    n_blocks = -(-n // BLOCK)
    held = [b for b in range(HELD_OUT_EVERY - 1, n_blocks, HELD_OUT_EVERY)]
    if not held:  # a small corpus: hold out its last tenth
        cut = n - max(n // HELD_OUT_EVERY, 1)
        return Pieces(stream, [(0, cut)]), Pieces(stream, [(cut, n)])
    val = [(b * BLOCK, min((b + 1) * BLOCK, n)) for b in held]
    edges = [0] + [edge for a, b in val for edge in (a, b)] + [n]
    train = list(zip(edges[::2], edges[1::2], strict=True))
    return Pieces(stream, train), Pieces(stream, val)


def _whole(stream: np.ndarray) -> Pieces:
    return Pieces(stream, [(0, len(stream))])


def _read_files(files: list[Path], max_bytes: int | None) -> np.ndarray:
    chunks, total = [], 0
    for path in files:
        data = path.read_bytes()
        if max_bytes is not None:
            data = data[: max_bytes - total]
        chunks.append(np.frombuffer(data, dtype=np.uint8))
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)


def stdlib_files() -> list[Path]:
    """The standard library's own .py sources (tests and site-packages left out), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in skip]  # prune: never walk into them
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(files)


def embedded(max_bytes: int) -> Corpus:
    files = stdlib_files()
    if not files:
        raise ConfigError(
            "task.data: no Python standard-library sources found for the default corpus"
        )
    train, val = _split(_read_files(files, max_bytes))
    return Corpus(train, val, 256, f"Python {sysconfig.get_python_version()} stdlib sources")


def load(data: str | None, max_bytes: int, vocab_size: int | None, source: str) -> Corpus:
    """Resolve the task's `data` setting into a corpus; errors name `source`.data."""
    if data is None:
        return embedded(max_bytes)
    path = Path(data).expanduser()
    if not path.exists():
        raise ConfigError(f"{source}.data: path not found: {path}")
    if path.is_dir() and (path / "train.bin").is_file():
        stream = _tokens(path / "train.bin", source)
        if (path / "val.bin").is_file():
            train, val = _whole(stream), _whole(_tokens(path / "val.bin", source))
        else:
            train, val = _split(stream)
        return _token_corpus(train, val, vocab_size, str(path), source)
    if path.is_file() and path.suffix == ".bin":
        train, val = _split(_tokens(path, source))
        return _token_corpus(train, val, vocab_size, str(path), source)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stream = _read_files(files, max_bytes)
    if len(stream) == 0:
        raise ConfigError(f"{source}.data: {path} holds no text")
    train, val = _split(stream)
    return Corpus(train, val, 256, f"text from {path}")


def _tokens(path: Path, source: str) -> np.ndarray:
    size = path.stat().st_size
    if size == 0 or size % 2:
        raise ConfigError(
            f"{source}.data: {path} is not a uint16 token file "
            f"(size {size} bytes; expected even, > 0)"
        )
    return np.memmap(path, dtype=np.uint16, mode="r")


def _token_corpus(
    train: Pieces, val: Pieces, vocab_size: int | None, where: str, source: str
) -> Corpus:
    largest = int(max(train.max(initial=0), val.max(initial=0)))
    if vocab_size is None:
        vocab_size = largest + 1
    elif largest >= vocab_size:
        raise ConfigError(
            f"{source}.vocab_size: {where} holds token {largest}, expected below {vocab_size}"
        )
    return Corpus(train, val, vocab_size, f"uint16 tokens from {where}")


def unigram_entropy(tokens: np.ndarray | Pieces, vocab_size: int) -> float:
    """Entropy (nats per token) of the token frequencies: the loss of the best unigram model.
    Counted a block at a time, so a memory-mapped split is never read whole into memory."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    chunks = tokens.chunks() if isinstance(tokens, Pieces) else [tokens]
    for chunk in chunks:
        for start in range(0, len(chunk), BLOCK * 16):
            block = np.asarray(chunk[start : start + BLOCK * 16], dtype=np.int64)
            counts += np.bincount(block, minlength=vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
