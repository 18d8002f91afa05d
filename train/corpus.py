"""The corpus without torch: which files, how many byte tokens, the train/validation split, and
checks that a corpus can feed one window. ``train.data`` (torch) and preflight share these.

    python -c "from simcluster.train.corpus import corpus_size, data_files; print(corpus_size(data_files('README.md')))"

The corpus is the files' bytes joined by one b"\\n" (a file, or a folder's files sorted), one
token per byte (vocab 256). The tail ``split_sizes(...)[1]`` bytes are held out for validation.

The default corpus (no --data) is pinned by content: the standard library's top-level modules named
in STDLIB_MODULES, in that order (never a listing of the folder, which every package that adds a file
to it would change), its identity the sha256 of their joined bytes; STDLIB_SHA256 is that of the
trainer image's Python, so a job in the image says ``pinned`` and an image that adds a package trains
on the same bytes. Another Python's standard library (a host's) gives another sha256, named as such.
"""
from __future__ import annotations

import codecs
import hashlib
import math
import os
import sys
import sysconfig

from simcluster.core.errors import ConfigError

IDENTITY_BYTES = 16 << 20  # the data identity hashes the first 16 MiB of the corpus (cheap, sees most edits)
STDLIB_MODULES = tuple("""
    __future__ __hello__ _aix_support _bootsubprocess _collections_abc _compat_pickle _compression
    _markupbase _osx_support _py_abc _pydecimal _pyio _sitebuiltins _strptime _threading_local
    _weakrefset abc aifc antigravity argparse ast asynchat asyncore base64 bdb bisect bz2 cProfile
    calendar cgi cgitb chunk cmd code codecs codeop colorsys compileall configparser contextlib
    contextvars copy copyreg crypt csv dataclasses datetime decimal difflib dis doctest enum filecmp
    fileinput fnmatch fractions ftplib functools genericpath getopt getpass gettext glob graphlib gzip
    hashlib heapq hmac imaplib imghdr imp inspect io ipaddress keyword linecache locale lzma mailbox
    mailcap mimetypes modulefinder netrc nntplib ntpath nturl2path numbers opcode operator optparse os
    pathlib pdb pickle pickletools pipes pkgutil platform plistlib poplib posixpath pprint profile
    pstats pty py_compile pyclbr pydoc queue quopri random reprlib rlcompleter runpy sched secrets
    selectors shelve shlex shutil signal site smtpd smtplib sndhdr socket socketserver sre_compile
    sre_constants sre_parse ssl stat statistics string stringprep struct subprocess sunau symtable
    sysconfig tabnanny tarfile telnetlib tempfile textwrap this threading timeit token tokenize trace
    traceback tracemalloc tty turtle types typing uu uuid warnings wave weakref webbrowser xdrlib zipapp
    zipfile zipimport
""".split())  # CPython 3.11's own top-level modules, none a distribution adds (sitecustomize, _sysconfigdata_*)
STDLIB_SHA256 = "111caf6075292cacf76244127188460f34ebb844d6d6a5eef116b44012341c71"  # their joined bytes in the trainer image (Python 3.11.2)
STDLIB_NAME = "python-stdlib"


def stdlib_files() -> list[str]:
    """The default corpus's files: each STDLIB_MODULES module's source in the running Python's
    standard library, in that order; a module another Python lacks (3.12 dropped asynchat, asyncore,
    imp, smtpd) is left out, and the identity then differs from the pin and says so.

    Raises:
        ConfigError: this Python has none of their sources, naming the fix.
    """
    root = sysconfig.get_paths()["stdlib"]
    out = [f for f in (os.path.join(root, name + ".py") for name in STDLIB_MODULES) if os.path.isfile(f)]
    if not out:
        raise ConfigError(f"data: the default corpus is this Python's standard library sources, and {root!r} holds "
                          f"none of them; pass --data FILE_OR_FOLDER")
    return out


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
    """What a checkpoint and the summary record about a corpus: name, size, file count and the sha256 of
    its first 16 MiB (in corpus order, files joined by b"\\n"). Cheap: one read of at most 16 MiB. The
    default corpus (path None) is named ``python-stdlib (pinned)`` when its sha256 is STDLIB_SHA256,
    else by this Python's version and the pin it differs from."""
    files = corpus_files(path)
    digest, left = hashlib.sha256(), IDENTITY_BYTES
    for i, f in enumerate(files):
        if left <= 0:
            break
        with open(f, "rb") as fh:
            chunk = fh.read(left)
        digest.update((b"\n" if i else b"") + chunk)
        left -= len(chunk) + (1 if i else 0)
    if path is None:
        sha = digest.hexdigest()
        name = f"{STDLIB_NAME} (pinned)" if sha == STDLIB_SHA256 else \
            f"{STDLIB_NAME} {sys.version.split()[0]} (not the pinned {STDLIB_SHA256[:12]})"
    else:
        name = os.path.basename(os.path.normpath(path))
    return {"name": name, "bytes": corpus_size(files), "files": len(files), "sha256_head": digest.hexdigest()}
