"""The corpus without torch: which files, how many byte tokens, the train/validation split, and
checks that a corpus can feed one window. ``train.data`` (torch) and preflight share these.

    python -c "from simcluster.train.corpus import corpus_size, data_files; print(corpus_size(data_files('README.md')))"

The corpus is the files' bytes joined by one b"\\n" (a file, or a folder's files sorted), one
token per byte (vocab 256). The tail ``split_sizes(...)[1]`` bytes are held out for validation.
"""
from __future__ import annotations

import codecs
import hashlib
import math
import os
import sysconfig

from simcluster.core.errors import ConfigError

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3",
             "tkinter", "turtledemo", "ensurepip"}
IDENTITY_BYTES = 16 << 20  # the data identity hashes the first 16 MiB of the corpus (cheap, sees most edits)


def stdlib_files() -> list[str]:
    """The running Python's standard-library .py sources (tests and GUI demos excluded), sorted."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        out += [os.path.join(dirpath, n) for n in names if n.endswith(".py")]
    return sorted(out)


def data_files(path: str) -> list[str]:
    """The text files of a data path: the file itself, or every file under a folder, sorted.

    Raises:
        ConfigError: the path is missing, unreadable, or holds no non-empty file.
    """
    if not os.path.exists(path):
        raise ConfigError(f"data: {path!r} does not exist; pass --data FILE_OR_FOLDER with UTF-8 text")
    if os.path.isdir(path):
        files = sorted(
            os.path.join(root, name)
            for root, dirs, names in os.walk(path)
            for name in names
            if not name.startswith(".")
        )
    else:
        files = [path]
    files = [f for f in files if os.path.isfile(f)]
    unreadable = [f for f in files if not os.access(f, os.R_OK)]
    if unreadable:
        raise ConfigError(f"data: cannot read {unreadable[0]!r}; fix its permissions or pass another --data")
    if not any(os.path.getsize(f) > 0 for f in files):
        raise ConfigError(f"data: {path!r} holds no text (empty); pass a non-empty file or folder with --data")
    return files


def corpus_files(path: str | None) -> list[str]:
    """The files of ``--data`` (None: the standard library sources), in corpus order."""
    return stdlib_files() if path is None else data_files(path)


def corpus_size(files: list[str]) -> int:
    """Tokens (bytes) of the joined corpus: every file plus one b"\\n" between files."""
    return sum(os.path.getsize(f) for f in files) + len(files) - 1


def split_sizes(n_tokens: int, val_fraction: float) -> tuple[int, int]:
    """(training tokens, validation tokens): the tail max(2, int(n * val_fraction)) is validation."""
    n_val = max(2, int(n_tokens * val_fraction))
    return n_tokens - n_val, n_val


def first_non_utf8(path: str) -> int | None:
    """Byte offset of the first invalid UTF-8 sequence in a file, or None when it is all UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes read before this chunk
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            pending = len(decoder.getstate()[0])  # bytes of a split character carried over
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                return offset - pending + e.start
            if not chunk:
                return None
            offset += len(chunk)


def check_corpus(path: str, seq_len: int, val_fraction: float, validates: bool) -> list[str]:
    """Problems of ``--data`` for a language model, each naming the field and a fix. Empty when fine.

    A window is seq_len + 1 tokens; the training split needs one, and so does the validation
    tail when the run validates (``validates``). The split is ``split_sizes``.
    """
    try:
        files = data_files(path)
    except ConfigError as e:
        return [str(e)]
    errors = []
    for f in files:
        bad = first_non_utf8(f)
        if bad is not None:
            errors.append(f"data: {f!r} is not UTF-8 text (invalid byte at offset {bad}); convert it "
                          f"(e.g. iconv -t UTF-8) or pass a text file with --data")
            break
    n = corpus_size(files)
    n_train, n_val = split_sizes(n, val_fraction)
    need = seq_len + 1
    if n_train < need:
        enough = need + 2
        while split_sizes(enough, val_fraction)[0] < need:
            enough += 1
        errors.append(f"data: {path!r} has {n} bytes; its training split ({n_train} bytes after holding out "
                      f"val_fraction={val_fraction}) is shorter than one window seq_len+1 = {need}; pass more text "
                      f"(at least {enough} bytes) or a smaller --seq-len")
    if validates and n_val < need:
        fraction = math.ceil(need / n * 1000) / 1000
        raise_it = f"raise --val-fraction to {fraction:g}, " if fraction <= 0.5 and n_train >= need else ""
        errors.append(f"val_fraction: the validation tail of {path!r} is {n_val} bytes (val_fraction={val_fraction} "
                      f"of {n}), shorter than one window seq_len+1 = {need}; {raise_it}pass more text, lower "
                      f"--seq-len, or set --val-every 0")
    return errors


def data_identity(path: str | None) -> dict:
    """What a checkpoint records about its corpus: name, size, file count and the sha256 of its
    first 16 MiB (in corpus order, files joined by b"\\n"). Cheap: one read of at most 16 MiB."""
    files = corpus_files(path)
    digest, left = hashlib.sha256(), IDENTITY_BYTES
    for i, f in enumerate(files):
        if left <= 0:
            break
        with open(f, "rb") as fh:
            chunk = fh.read(left)
        digest.update((b"\n" if i else b"") + chunk)
        left -= len(chunk) + (1 if i else 0)
    name = "<python stdlib>" if path is None else os.path.basename(os.path.normpath(path))
    return {"name": name, "bytes": corpus_size(files), "files": len(files), "sha256_head": digest.hexdigest()}
