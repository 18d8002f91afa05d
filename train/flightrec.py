"""torch's Flight Recorder dumps: the environment that makes a real cluster's job write them on a
timeout, the rehearsal's own dump at a stall, and a folder of them read into the stall watch's lines.

    python -m launcher diagnose runs/hang            # the run folder, or its flight-recorder/ folder

The environment (simcluster/core/flightrec.py ``dump_env``, the one home of it: the Slurm, JobSet, TrainJob
and SkyPilot documents call it): ``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries kept per process (torch's Flight
Recorder reads it, or ``TORCH_FR_BUFFER_SIZE``), ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` (the NCCL
watchdog dumps on a collective's timeout or error), ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` the
path prefix torch appends the global rank to (``RUN_DIR/flight-recorder/nccl_trace_rank_``;
torch's default is the node's own ~/.cache/torch, lost with the node), ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC``
how long the watchdog waits for the dump before it tears the process down (torch's default
15 s; stacks are symbolized then), and a heartbeat timeout (``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``)
longer than that wait, so the monitor thread never kills a rank that is still dumping.

In the rehearsal (gloo) no watchdog dumps: torch 2.13's ProcessGroupGloo records into the same
Flight Recorder but writes nothing on a timeout. The stall watch (train/stallwatch.py) writes
each rank's dump instead (``write_dump``) when that environment names a prefix: torch's own
``_dump_fr_trace`` bytes, with ``pg_config`` completed from the rank's group table where gloo
left it empty (torch 2.13 on gloo writes ``{'': {'ranks': '[]'}}``, and torch's analyzer
``fr_trace`` then stops with a ``KeyError`` on the default group).

``diagnose_folder`` reads one dump per rank (torch's pickle of plain dicts and lists; anything
else is refused, never run), turns each into the stall watch's record (train/commrecord.py
``collectives``; NCCL's send/recv entries as its point-to-point calls) and names the first
disagreement with simcluster/core/hang_diagnosis.py ``disagreement``: the same lines as the stall watch,
under the head ``HANG in the Flight Recorder dumps of N ranks:``. Dumps have no Python stack of
a rank outside its calls: a rank in no collective is named by its last recorded call. A group's
ranks come from ``pg_config`` (NCCL, the rehearsal), else from the dumps that use the group.
"""
from __future__ import annotations

import ast
import io
import os
import pickle
import re

from simcluster.core.errors import ConfigError
from simcluster.core.flightrec import DUMP_DIR, FILE_PREFIX, FIX, PREFIX_KEYS
from simcluster.train.commrecord import collectives, short
from simcluster.core.hang_diagnosis import disagreement
from simcluster.core.paths import unresolved

def write_dump(rank: int, groups: dict[str, list[int]], env=os.environ) -> str | None:
    """This rank's Flight Recorder dump, written as the NCCL watchdog would (PREFIX + rank), when
    env names a prefix and leaves TORCH_NCCL_DUMP_ON_TIMEOUT on; the file's path, else None.
    groups: each group's name -> its global ranks (commrecord.group_table), for ``pg_config``."""
    prefix = next((env[k] for k in PREFIX_KEYS if env.get(k)), None)
    if not prefix or env.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1").lower() in ("0", "false", "no", "off"):
        return None
    import torch._C._distributed_c10d as c10d

    dump = pickle.loads(c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False))
    config = dump.get("pg_config") or {}
    if any(name not in config for name in groups):  # gloo: the groups' ranks as ProcessGroupNCCL records them
        descs = {str(e["process_group"][0]): str(e["process_group"][1]) for e in dump.get("entries", [])}
        dump["pg_config"] = {name: {"name": name, "desc": descs.get(name, "default_pg" if name == "0" else "undefined"),
                                    "ranks": str(list(ranks))} for name, ranks in groups.items()}
    path = f"{prefix}{rank}"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "wb") as fh:
        pickle.dump(dump, fh)
    os.replace(path + ".tmp", path)
    return path


class _PlainData(pickle.Unpickler):
    """A dump holds dicts, lists, strings and numbers only: a pickle naming any class or function
    is refused, never loaded."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a Flight Recorder dump never does")


def read_dump(path: str) -> dict:
    """One dump file -> its dict (``version``, ``pg_config``, ``entries``...).

    Raises:
        ConfigError: a file that is cut short, no pickle, or no Flight Recorder dump, naming it and the fix.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror}); {FIX}") from None
    try:
        dump = _PlainData(io.BytesIO(data)).load()
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError, MemoryError) as e:
        why = ("it is empty (the rank died before writing it)" if not data else
               "it ends early (truncated: the rank was killed while writing it, or a copy was cut short)"
               if data.startswith(pickle.PROTO) and not data.endswith(pickle.STOP) else
               "it is JSON, and diagnose reads the pickled dumps torch writes by default" if data.lstrip()[:1] in (b"{", b"[")
               else f"it is no pickle (it begins {data[:12]!r})" if not data.startswith(pickle.PROTO)
               else f"it is no Flight Recorder dump ({type(e).__name__}: {e})")
        raise ConfigError(f"{path}: {why}; remove it, or {FIX}") from None
    if not isinstance(dump, dict) or not {"version", "entries"} <= set(dump):
        raise ConfigError(f"{path}: a pickle without a Flight Recorder dump's keys (version, entries); {FIX}")
    return dump


_RANK = re.compile(r"^(.*?)(\d+)$")


def dump_files(folder: str) -> dict[int, str]:
    """The dumps of a folder (or of its flight-recorder/ folder): global rank -> path.

    Raises:
        ConfigError: an empty name, no such folder (a file, a dead or looping link), one that cannot be read, no
            file named PREFIX<rank>, or two prefixes (two jobs' dumps).
    """
    if not folder.strip():
        raise ConfigError(f"diagnose: {folder!r} names no folder; {FIX}")
    if os.path.isdir(os.path.join(folder, DUMP_DIR)):
        folder = os.path.join(folder, DUMP_DIR)
    if not os.path.isdir(folder):
        what = unresolved(folder, "no such folder") or "a file, not a folder"
        raise ConfigError(f"diagnose {folder}: {what}; {FIX}")
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise ConfigError(f"diagnose {folder}: cannot be read ({e.strerror}); {FIX}") from None
    prefixes: dict[str, dict[int, str]] = {}
    for name in names:
        m = _RANK.match(name)
        if m and os.path.isfile(os.path.join(folder, name)):
            ranks = prefixes.setdefault(m.group(1), {})
            if int(m.group(2)) in ranks:
                raise ConfigError(f"diagnose {folder}: {os.path.basename(ranks[int(m.group(2))])} and {name} both name "
                                  f"rank {int(m.group(2))}; keep one dump a rank; {FIX}")
            ranks[int(m.group(2))] = os.path.join(folder, name)
    if not prefixes:
        raise ConfigError(f"diagnose {folder}: no Flight Recorder dumps in it (files PREFIX<rank>, e.g. "
                          f"{FILE_PREFIX}0); {FIX}")
    if len(prefixes) > 1:
        names = ", ".join(f"{p}<rank> ({len(v)})" for p, v in sorted(prefixes.items()))
        raise ConfigError(f"diagnose {folder}: dumps of more than one job ({names}); {FIX}")
    return next(iter(prefixes.values()))


def _group(entry: dict) -> str:
    """An entry's group name (``process_group`` is (name, description))."""
    return str((entry.get("process_group") or ("?",))[0])


def _ranks_of(config: dict) -> dict[str, list[int]]:
    """pg_config's groups that name their ranks: name -> global ranks (gloo's empty '' entry left out)."""
    out = {}
    for name, pg in (config or {}).items():
        try:
            ranks = ast.literal_eval(str(pg.get("ranks", "[]"))) if isinstance(pg, dict) else []
        except (ValueError, SyntaxError):
            ranks = []
        if name and ranks:
            out[str(name)] = sorted(int(r) for r in ranks)
    return out


def job_groups(dumps: dict[int, dict], files: dict[int, str]) -> tuple[dict[str, list[int]], int]:
    """Every group's global ranks and the job's world size, from one job's dumps.

    Raises:
        ConfigError: dumps that disagree on torch's dump version, on a group's ranks, or that name a
            rank outside their job (dumps of different jobs in one folder), naming both files.
    """
    groups: dict[str, list[int]] = {}
    seen: dict[str, int] = {}
    first = min(dumps)
    for rank, dump in sorted(dumps.items()):
        if dump.get("version") != dumps[first].get("version"):
            raise ConfigError(f"{files[rank]}: Flight Recorder version {dump.get('version')}, {files[first]}: "
                              f"{dumps[first].get('version')}: dumps of different jobs (or torch versions); {FIX}")
        for name, ranks in _ranks_of(dump.get("pg_config")).items():
            if name in groups and groups[name] != ranks:
                raise ConfigError(f"{files[rank]}: group {name} has ranks {ranks}, in {files[seen[name]]} {groups[name]}: "
                                  f"dumps of different jobs; {FIX}")
            groups.setdefault(name, ranks)
            seen.setdefault(name, rank)
    world = len(groups["0"]) if "0" in groups else max(dumps) + 1
    groups.setdefault("0", list(range(world)))
    for rank, dump in sorted(dumps.items()):
        used = {_group(e) for e in dump.get("entries", [])}
        outside = sorted(n for n in used if n in groups and rank not in groups[n])
        if rank >= world or outside:
            where = f"group {outside[0]} {groups[outside[0]]}" if outside else f"a job of {world} ranks"
            raise ConfigError(f"{files[rank]}: rank {rank} is not in {where} ({files[first]}): dumps of different "
                              f"jobs; {FIX}")
    used = {_group(e) for d in dumps.values() for e in d.get("entries", [])}
    for name in used - set(groups):  # gloo without pg_config: a group's ranks are the dumps that use it
        groups[name] = sorted(r for r, d in dumps.items() if any(_group(e) == name for e in d.get("entries", [])))
    return groups, world


_TORCH = re.compile(r"[/\\](site|dist)-packages[/\\]torch[/\\]")
_STDLIB = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\]")


def dump_foreign(path: str) -> bool:
    """A frame of a dump that is torch's, the standard library's or the instruments' (by its path:
    the dump was written on another machine, whose torch lives elsewhere)."""
    if not path or path.startswith("<") or _TORCH.search(path) or "/launcher/instrument/" in path:
        return True
    return bool(_STDLIB.search(path)) and "-packages" not in path


_P2P = re.compile(r"^\w+:(send|recv) (\d+)(?:->|<-)(\d+)$")


def _p2p(entries: list[dict], groups: dict[str, list[int]]) -> list[dict]:
    """NCCL's send/recv entries (``nccl:send 0->1``, ``nccl:recv 1<-0``: group ranks, this one first)
    as the record's point-to-point calls, each numbered per (op, peer) as train/commrecord.py does."""
    out, count = [], {}
    for e in entries:
        m = _P2P.match(str(e.get("profiling_name", "")))
        if not m:
            continue
        ranks = groups.get(_group(e)) or []
        peer = ranks[int(m.group(3))] if int(m.group(3)) < len(ranks) else None
        count[(m.group(1), peer)] = count.get((m.group(1), peer), 0) + 1
        where = next((f"{short(f['filename'])}:{f['line']}" for f in e.get("frames") or []
                      if not dump_foreign(f.get("filename", ""))), "?")
        out.append({"op": m.group(1), "peer": peer, "group": ranks, "seq": count[(m.group(1), peer)],
                    "shapes": e.get("input_sizes"), "dtype": str((e.get("input_dtypes") or ["?"])[0]).lower(),
                    "where": where, "state": "completed" if e.get("retired") or e.get("state") == "completed"
                    else "entered", "t": round((e.get("time_created_ns") or 0) / 1e9, 3)})
    return out


def record(rank: int, dump: dict, groups: dict[str, list[int]]) -> dict:
    """One rank's dump as the stall watch's record (no "top": a dump has no stack outside its calls;
    "last": its newest collective, named where it waits in none)."""
    entries = dump.get("entries") or []
    colls = collectives([e for e in entries if not e.get("is_p2p")], groups, dump_foreign)
    rec = {"rank": rank, "groups": groups, "collectives": colls, "p2p": _p2p(entries, groups)}
    e = max(colls, key=lambda x: x["t"]) if colls else None
    rec["last"] = (f"{e['op']} #{e['seq']} of group {e['group']} {e['state']} ({e['where']})" if e else
                   "its start (its dump holds no collective)")
    return rec


def diagnose_folder(folder: str) -> list[str]:
    """The stall watch's lines from a folder of one job's Flight Recorder dumps (see the module's docstring).

    Raises:
        ConfigError: no dumps, a truncated or foreign file, dumps of different jobs, dumps with no entries.
    """
    files = dump_files(folder)
    dumps = {rank: read_dump(path) for rank, path in sorted(files.items())}
    if not any(d.get("entries") for d in dumps.values()):
        raise ConfigError(f"diagnose {folder}: the dumps hold no entries (the Flight Recorder was off: "
                          f"TORCH_NCCL_TRACE_BUFFER_SIZE=0?); {FIX}")
    groups, world = job_groups(dumps, files)
    records = {rank: record(rank, dump, groups) for rank, dump in dumps.items()}
    lines = disagreement(records, world, silent=f"left no dump (no {FILE_PREFIX}<rank> file: the rank died "
                                                 f"before its watchdog dumped, or its node's disk is elsewhere)")
    return [f"HANG in the Flight Recorder dumps of {len(dumps)} ranks: {lines[0]}", *lines[1:]]
