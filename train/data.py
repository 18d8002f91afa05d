"""Byte-level data: a corpus of UTF-8 text as uint8 tokens, and batches as pure functions of
(seed, step, dp rank), so runs are reproducible and resumable on any mesh.

    python -c "from simcluster.train.data import load_corpus; print(load_corpus(None).numel())"   # stdlib bytes
"""
from __future__ import annotations

import bisect
import os

import torch
import torch.utils.data

from simcluster.train.corpus import corpus_files, split_sizes


def load_corpus(path: str | None) -> torch.Tensor:
    """All bytes of a text file, a folder of files (sorted), or the stdlib when path is None.

    Returns a 1-D uint8 tensor (tokens, vocab 256). Raises ConfigError for a bad path.
    """
    files = corpus_files(path)
    sizes = [os.path.getsize(f) for f in files]
    buf = bytearray(sum(sizes) + len(files) - 1)  # files joined by b"\n", read in place: no copies
    view, pos = memoryview(buf), 0
    for f, size in zip(files, sizes):
        with open(f, "rb") as fh:
            pos += fh.readinto(view[pos:pos + size])
        if pos < len(buf):
            buf[pos] = 0x0A
            pos += 1
    return torch.frombuffer(buf, dtype=torch.uint8)


class Corpus:
    """The bytes ``load_corpus`` returns, read from the files on demand instead of held: a rank
    keeps only the file list and sizes (the default corpus is 4.6 MB, once per rank when held).
    ``numel()``, a slice ``c[a:b]`` (a Corpus again) and, as a tensor's indexing in ``lm_batch``,
    ``c[idx]`` for a (rows, n) index of consecutive positions (a uint8 tensor of those bytes)."""

    def __init__(self, path: str | None, files: list[str] | None = None, start: int = 0, stop: int | None = None):
        self.path, self.files = path, files if files is not None else corpus_files(path)
        self.offsets = [0]  # where each file starts in the joined bytes (files joined by b"\n")
        for f in self.files:
            self.offsets.append(self.offsets[-1] + os.path.getsize(f) + 1)
        self.start, self.stop = start, self.offsets[-1] - 1 if stop is None else stop

    def numel(self) -> int:
        return self.stop - self.start

    def read(self, a: int, b: int) -> bytes:
        """The joined bytes [a, b) of this corpus (positions relative to its start)."""
        a, b, out = a + self.start, b + self.start, bytearray()
        k = bisect.bisect_right(self.offsets, a) - 1
        while a < b:
            end = self.offsets[k + 1] - 1  # the file's end; its separator (b"\n") is at end
            if a < end:
                with open(self.files[k], "rb") as fh:
                    fh.seek(a - self.offsets[k])
                    out += fh.read(min(b, end) - a)
                a = min(b, end)
            if a == end and a < b:
                out += b"\n"
                a, k = a + 1, k + 1
        return bytes(out)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            a, b, _ = idx.indices(self.numel())
            return Corpus(self.path, self.files, self.start + a, self.start + b)
        rows = [self.read(int(r[0]), int(r[-1]) + 1) for r in idx]
        return torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8).view(idx.shape)


def train_val_split(tokens, val_fraction: float):
    """Head for training, tail (val_fraction of the bytes) for validation (sizes: ``split_sizes``); a
    tensor's or a Corpus's slices."""
    n_train, _ = split_sizes(tokens.numel(), val_fraction)
    return tokens[:n_train], tokens[n_train:]


def _generator(seed: int, step: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + salt) % (2**63))


def lm_batch(tokens: torch.Tensor, seed: int, step: int, batch: int, seq_len: int,
             salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: ``batch`` random windows of the corpus.

    Returns inputs and targets, each (batch, seq_len) int64, targets shifted by one token.
    Raises ValueError if the corpus is shorter than seq_len + 1 tokens.
    """
    if tokens.numel() < seq_len + 1:
        raise ValueError(f"data: corpus of {tokens.numel()} bytes is shorter than seq_len+1={seq_len + 1}")
    starts = torch.randint(0, tokens.numel() - seq_len, (batch,), generator=_generator(seed, step, salt))
    window = tokens[starts[:, None] + torch.arange(seq_len + 1)].long()
    # contiguous: torch pipelining checks a stage input's strides against its first one under
    # TORCH_DISTRIBUTED_DEBUG=DETAIL (--check-collectives 1), and a slice's are (seq_len + 1, 1)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def seed_batch(seed: int, step: int, batch: int, dim: int, classes: int,
               salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data for the seed model: x (batch, dim) float32 ~ N(0, 1) and a learnable class
    (batch,) int64, the argmax of x under a fixed random projection drawn from ``seed``."""
    x = torch.randn(batch, dim, generator=_generator(seed, step, salt))
    proj = torch.randn(dim, classes, generator=torch.Generator().manual_seed(seed))
    return x, (x @ proj).argmax(-1)


def dp_shard(t: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    """This dp rank's contiguous slice of a global batch along dim 0 (same on all tp peers)."""
    per = t.shape[0] // dp
    return t[dp_rank * per:(dp_rank + 1) * per]


def _as_made(batch):
    """The DataLoader's collate function: the dataset's batch as it was made (a tuple of tensors)."""
    return batch


class StepData(torch.utils.data.Dataset):
    """A map-style dataset of global batches: item ``k`` is batch ``k`` (a step, or a validation index)
    of ``Batches``, drawn with ``salt``; read through torch's DataLoader as a real job's loader reads."""

    def __init__(self, batches: "Batches", tokens, salt: int):
        self.batches, self.tokens, self.salt = batches, tokens, salt

    def __getitem__(self, k: int):
        return self.batches.make(self.tokens, k, self.salt)


class Batches:
    """Global batches of a run: ``train(step)`` and ``val(k)`` return (inputs, targets), each read
    through a ``torch.utils.data.DataLoader`` (no worker, no collation: the dataset's item is the
    batch), the host-side door a data loader is on a GPU host (a full-size plan makes a loader's batches
    outside its fake mode, with their values: launcher/instrument/fullsize.py)."""

    def __init__(self, cfg, args):
        self.cfg, self.args = cfg, args
        self.train_tokens = self.val_tokens = None
        if args.kind == "llama":
            self.train_tokens, self.val_tokens = train_val_split(Corpus(cfg.data), cfg.val_fraction)
        self.train_set, self.val_set = StepData(self, self.train_tokens, 0), StepData(self, self.val_tokens, 1_000_000_007)
        self._seeds = torch.Generator().manual_seed(cfg.seed)

    def make(self, tokens, step: int, salt: int):
        """The global batch ``step`` drawn with ``salt`` (seed_batch or lm_batch)."""
        cfg, args = self.cfg, self.args
        if args.kind == "seed":
            return seed_batch(cfg.seed, step, cfg.global_batch, args.dim, args.vocab_size, salt)
        return lm_batch(tokens, cfg.seed, step, cfg.global_batch, cfg.seq_len, salt)

    def _load(self, dataset: StepData, k: int):
        # its own generator: a DataLoader's iterator draws its base seed from it, never from torch's global one
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, sampler=[k], collate_fn=_as_made,
                                             generator=self._seeds)
        return next(iter(loader))

    def train(self, step: int):
        return self._load(self.train_set, step)

    def val(self, k: int):
        return self._load(self.val_set, k)
