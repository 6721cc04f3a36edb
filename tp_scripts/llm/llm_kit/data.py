"""Token batches: random tokens for throughput work, or bytes of real text for a loss that falls.

The text is the Python standard library's own source, present on every machine with Python: no
download. Tokens are bytes (vocabulary 256), so any config's vocabulary is large enough.

Batches are a pure function of (seed, step): every rank draws the same global batch and keeps its
own slice. A resumed run therefore sees exactly the batches it would have seen, and a data-parallel
run sees the same global batch as a single process.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import torch


def stdlib_text_bytes(max_bytes: int = 8_000_000) -> torch.Tensor:
    """The standard library's .py files in sorted path order (tests and site-packages left out), concatenated,
    as a uint8 tensor."""
    chunks, total = [], 0
    for path in _stdlib_sources(sysconfig.get_paths()["stdlib"]):
        data = Path(path).read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)


def _stdlib_sources(folder: str):
    """Depth first, names sorted: the order of sorted(Path.rglob). The skipped folders are never walked (they
    hold most of the files: a full rglob took 0.3 s of every job)."""
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in ("site-packages", "test"):
                    yield from _stdlib_sources(entry.path)
            elif entry.name.endswith(".py"):
                yield entry.path


class TokenBatches:
    """global_batch(step) -> (inputs, targets), each (batch, seq) int64."""

    def __init__(self, source: str, vocab_size: int, batch_size: int, seq_len: int, seed: int = 0):
        if source not in ("random", "text"):
            raise ValueError(f"unknown data source {source!r}; use 'random' or 'text'")
        self.source, self.vocab_size, self.batch_size, self.seq_len, self.seed = (
            source, vocab_size, batch_size, seq_len, seed)
        if source == "text":
            corpus = stdlib_text_bytes()
            split = int(0.95 * len(corpus))
            self.train, self.val = corpus[:split], corpus[split:]

    def global_batch(self, step: int, split: str = "train"):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step + (10**9 if split == "val" else 0))
        shape = (self.batch_size, self.seq_len + 1)
        if self.source == "random":
            window = torch.randint(0, self.vocab_size, shape, generator=generator)
        else:
            corpus = self.train if split == "train" else self.val
            starts = torch.randint(0, len(corpus) - self.seq_len - 1, (self.batch_size,), generator=generator)
            window = torch.stack([corpus[s: s + self.seq_len + 1] for s in starts.tolist()]).long()
        return window[:, :-1], window[:, 1:]

    def local_batch(self, step: int, dp_rank: int, dp_size: int, split: str = "train"):
        inputs, targets = self.global_batch(step, split)
        per_rank = self.batch_size // dp_size
        rows = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
        return inputs[rows], targets[rows]
