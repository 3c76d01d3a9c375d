"""Token streams for tinylm: the embedded corpus, a folder of text, or uint16 token files.

The embedded default is Python's own standard-library sources, present on every machine with no
download. Text is read as bytes (a byte-level vocabulary of 256). Token files follow nanoGPT's
layout: a flat array of uint16, either one `.bin` file or a folder with `train.bin` and
`val.bin`. Without a separate validation file the split is deterministic: every tenth block of
64 KiB is held out.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedule_search.config import ConfigError

BLOCK = 1 << 16
HELD_OUT_EVERY = 10


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    description: str


def _split(stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every HELD_OUT_EVERY-th block of BLOCK tokens goes to validation."""
    n_blocks = -(-len(stream) // BLOCK)
    held_out = np.zeros(len(stream), dtype=bool)
    for block in range(HELD_OUT_EVERY - 1, n_blocks, HELD_OUT_EVERY):
        held_out[block * BLOCK : (block + 1) * BLOCK] = True
    if not held_out.any():  # a small corpus: hold out its last tenth
        held_out[len(stream) - max(len(stream) // HELD_OUT_EVERY, 1) :] = True
    return stream[~held_out], stream[held_out]


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
        train = _tokens(path / "train.bin", source)
        val = _tokens(path / "val.bin", source) if (path / "val.bin").is_file() else None
        if val is None:
            train, val = _split(train)
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
    train: np.ndarray, val: np.ndarray, vocab_size: int | None, where: str, source: str
) -> Corpus:
    largest = int(max(train.max(initial=0), val.max(initial=0)))
    if vocab_size is None:
        vocab_size = largest + 1
    elif largest >= vocab_size:
        raise ConfigError(
            f"{source}.vocab_size: {where} holds token {largest}, expected below {vocab_size}"
        )
    return Corpus(train, val, vocab_size, f"uint16 tokens from {where}")


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats per token) of the token frequencies: the loss of the best unigram model."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size).astype(
        np.float64
    )
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
