"""The diagnosis of a stall: the first point where the ranks' records disagree, in a line or two.

    python -c "from simcluster.core.hang_diagnosis import diagnose; print(diagnose({0: {'top': 'a.py:3 (f)', 'step': 2}, 1: {'top': 'a.py:9 (g)', 'step': 2}}, 2, 60))"

Pure: every rank's record (train/commrecord.py ``Record.snapshot`` plus "step" and "top", its main
thread's innermost frame outside torch) in, lines out. The cases, in the order they are looked for:

- a collective whose op, shapes or dtypes differ across its group at one sequence number: both
  sides named (``MISMATCH``);
- two ranks that both receive from each other first;
- ranks waiting in collective #k of a group that other ranks of the group never entered: the
  waiting ranks, and what each missing rank does instead (its own pending call, or its top frame);
- a point-to-point call with no partner: a recv (or send) whose peer waits elsewhere;
- no rank in any call: each rank's top frame (busy or stuck in Python);
- ranks whose record never came (died, or stuck holding the interpreter's lock).

``quiet_note`` words the other verdict: every rank outside communication for the stall's length (no
hang, the job goes on), with what each rank does.

The first line starts ``HANG at step S after N s:``; S is the first step not yet ended on the
slowest rank (1-based), N the seconds without progress on any rank. While no rank has ended a step
(a hang in step 1, or code with no optimizer step to count) it starts ``HANG before any step
ended, after N s:``.
"""
from __future__ import annotations

import re


SPAN_OVER = 8  # a list of more ranks than this is written as spans: 0-255, 512-767


def spans(rs) -> str:
    """Ranks as a person reads them: ``0, 2, 3`` (at most SPAN_OVER), else runs of consecutive ranks
    joined, ``0-255, 512-767``."""
    rs = sorted(int(r) for r in rs)
    if len(rs) <= SPAN_OVER:
        return ", ".join(map(str, rs))
    runs: list[list[int]] = []
    for r in rs:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _ranks(rs) -> str:
    rs = list(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + spans(rs)


def _plural(text: str) -> str:
    """``waits in ...`` said of several ranks: ``wait in ...``."""
    return "wait " + text[6:] if text.startswith("waits ") else "are " + text[3:] if text.startswith("is ") else text


def _alike(pairs) -> str:
    """``rank R text`` per (rank, text), ranks with the same text joined: ``ranks 0-511 wait in ...``."""
    groups: dict[str, list[int]] = {}
    for r, text in pairs:
        groups.setdefault(text, []).append(int(r))
    return "; ".join(f"{_ranks(rs)} {text if len(rs) == 1 else _plural(text)}" for text, rs in groups.items())


def _shape(e: dict) -> str:
    shapes = e.get("shapes") or []
    text = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
    dtypes = e.get("dtypes") or ([e["dtype"]] if e.get("dtype") else [])
    return f"{text} {'/'.join(sorted(set(dtypes)))}".strip()


def _coll(e: dict) -> str:
    return f"{e['op']} #{e['seq']} of group [{spans(e['group'])}]"


def _p2p(e: dict) -> str:
    peer = "any rank" if e.get("peer") is None else f"rank {e['peer']}"
    return f"{e['op']} #{e['seq']} {'to' if e['op'] == 'send' else 'from'} {peer}"


def pending(rec: dict) -> list[tuple[str, dict]]:
    """The calls a rank entered and did not complete, oldest first: ("coll" | "p2p", entry)."""
    out = [("coll", e) for e in rec.get("collectives", []) if e.get("state") != "completed"]
    out += [("p2p", e) for e in rec.get("p2p", []) if e.get("state") != "completed"]
    return sorted(out, key=lambda x: x[1].get("t", 0))


def doing(rec: dict) -> str:
    """What a rank does: the call it waits in (file:line), else its top frame."""
    waits = pending(rec)
    if waits:
        kind, e = waits[-1] if waits[-1][0] == "coll" else waits[0]
        return f"waits in {_coll(e) if kind == 'coll' else _p2p(e)} ({e.get('where', '?')})"
    if "top" not in rec and rec.get("last"):  # a Flight Recorder dump: no Python stack, its last call
        return f"is in no collective since {rec['last']}"
    return f"is in no collective: busy in Python at {rec.get('top', '?')}"


_PEER = re.compile(r"(to|from) rank (\d+)")


def _together(states: list[tuple[int, str]], what: str) -> list[str]:
    """``rank 1 never entered it, it waits in ...`` per rank; ranks doing the same (their peers
    aside) joined: ``ranks 0, 1 never entered it, each waits in send #6 to rank 2, 3 in turn (x.py:9)``."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for q, text in states:
        groups.setdefault(_PEER.sub(r"\1 rank R", text), []).append((q, text))
    out = []
    for key, members in groups.items():
        if len(members) == 1:
            out.append(f"{_ranks([members[0][0]])} {what}, it {members[0][1]}")
            continue
        peers = [m.group(2) for _, text in members if (m := _PEER.search(text))]
        text = key.replace("rank R", f"rank {', '.join(peers)} in turn", 1) if len(peers) == len(members) else key
        out.append(f"{_ranks([q for q, _ in members])} {what}, each {text}")
    return out


def _mismatch(records: dict) -> str | None:
    seen: dict[tuple, dict[int, dict]] = {}
    for r, rec in records.items():
        for e in rec.get("collectives", []):
            seen.setdefault((tuple(e.get("group") or ()), e.get("seq")), {})[r] = e
    for (group, seq), by_rank in sorted(seen.items(), key=lambda x: (x[0][1] or 0, x[0][0])):
        kinds: dict[tuple, list[int]] = {}
        for r, e in by_rank.items():
            kinds.setdefault((e["op"], _shape(e)), []).append(r)
        if len(kinds) > 1:
            sides = [f"{_ranks(rs)} {'runs' if len(rs) == 1 else 'run'} {' '.join(filter(None, (op, shape)))} "
                     f"({by_rank[rs[0]].get('where', '?')})"
                     for (op, shape), rs in sorted(kinds.items(), key=lambda x: min(x[1]))]
            return f"MISMATCH in collective #{seq} of group [{spans(group)}]: " + "; ".join(sides)
    return None


def _missing(records: dict) -> str | None:
    for r in sorted(records):
        for kind, e in pending(records[r]):
            if kind != "coll":
                continue
            group, seq = e.get("group") or [], e.get("seq")
            waiting, absent = [], []
            for q in group:
                rec = records.get(q)
                if rec is None:
                    continue
                mine = [x for x in rec.get("collectives", []) if x.get("group") == group and x.get("seq") == seq]
                (waiting if mine else absent).append(q)
            if absent:
                others = "; ".join(_together([(q, doing(records[q])) for q in absent], "never entered it"))
                verb = "waits" if len(waiting) == 1 else "wait"
                return f"{_ranks(waiting)} {verb} in {_coll(e)} ({e.get('where', '?')}); {others}"
    return None


def _unmatched(records: dict, cycles_only: bool = False) -> str | None:
    for r in sorted(records):
        for kind, e in pending(records[r]):
            if kind != "p2p" or e.get("peer") is None or e["peer"] not in records:
                continue
            peer = records[e["peer"]]
            want = "send" if e["op"] == "recv" else "recv"
            partner = [x for x in peer.get("p2p", []) if x["op"] == want and x.get("peer") in (r, None)
                       and x.get("seq") == e["seq"]]
            if partner:
                continue
            theirs = [x for k, x in pending(peer) if k == "p2p" and x["op"] == e["op"] and x.get("peer") == r]
            if cycles_only and not (theirs and e["op"] == "recv"):
                continue
            if theirs and e["op"] == "recv":
                return (f"ranks {r} and {e['peer']} both receive first: rank {r} waits in {_p2p(e)} "
                        f"({e.get('where', '?')}), rank {e['peer']} in {_p2p(theirs[0])} ({theirs[0].get('where', '?')}); "
                        f"neither sends")
            return (f"rank {r} waits in {_p2p(e)} ({e.get('where', '?')}); rank {e['peer']} never posted the "
                    f"matching {want}, it {doing(peer)}")
    return None


def diagnose(records: dict, world_size: int, idle_s: float) -> list[str]:
    """One or two lines naming the first disagreement (see the module's docstring).

    records: global rank -> its record (missing ranks never answered); world_size: ranks of the job;
    idle_s: seconds without progress on any rank.
    """
    records = {int(r): v for r, v in records.items()}
    steps = [int(v.get("step") or 0) for v in records.values()]
    head = (f"HANG at step {min(steps) + 1} after {idle_s:.0f} s: " if steps and max(steps) > 0 else
            f"HANG before any step ended, after {idle_s:.0f} s: ")  # in step 1, or code without optimizer steps
    lines = disagreement(records, world_size)
    return [head + lines[0], *lines[1:]]


SILENT = "sent no record (died, or stuck in C code holding the interpreter's lock)"


def disagreement(records: dict, world_size: int, silent: str = SILENT) -> list[str]:
    """The diagnosis without its head: the first disagreement of the records (one line), then the
    ranks that sent none. The stall watch (``diagnose``) and ``launcher diagnose`` on Flight
    Recorder dumps (train/flightrec.py) both call it.

    records: global rank -> its record; world_size: ranks of the job; silent: what is said of the
    ranks with no record.
    """
    records = {int(r): v for r, v in records.items()}
    lines = []
    found = _mismatch(records) or _unmatched(records, cycles_only=True) or _missing(records) or _unmatched(records)
    if found is None:
        busy = [r for r in sorted(records) if not pending(records[r])]
        if busy and len(busy) < len(records):
            waits = [r for r in sorted(records) if r not in busy]
            found = _alike([(r, doing(records[waits[0]])) for r in waits] + [(r, doing(records[r])) for r in busy])
        elif busy:
            found = "no rank waits in a call: " + _alike((r, f"at {records[r]['top']}" if "top" in records[r]
                                                          else doing(records[r])) for r in busy)
        else:
            found = _alike((r, doing(records[r])) for r in sorted(records))
    lines.append(found)
    missing = sorted(set(range(world_size)) - set(records))
    if missing:
        lines.append(f"{_ranks(missing)} {silent}")
    return lines


def quiet_note(doing: dict, world_size: int, quiet_s: float, stall_s: float) -> str:
    """The note of a quiet spell that is no hang: no rank progressed for quiet_s seconds (at least the
    watch's stall_s) and none waits in communication. doing: global rank -> what it does (``at x.py:9
    (f)``, ``compiling (torch.compile) at ...``); ranks doing the same are joined."""
    parts = [_alike(sorted((int(r), text) for r, text in doing.items()))]
    silent = sorted(set(range(world_size)) - {int(r) for r in doing})
    if silent:
        parts.append(f"{_ranks(silent)} did not answer")
    return (f"note: no rank progressed for {quiet_s:.0f} s and none waits in a collective or a send/recv, so this "
            f"is no hang (--stall-s {stall_s:g} ends a job only while a rank waits in communication); the job goes "
            f"on: " + "; ".join(parts))


def slow_note(call: tuple[str, int, int], quiet_s: float, stall_s: float) -> str:
    """The note of a slow collective that is no hang: every waiting rank has been inside collective
    ``call`` (group name, sequence number, group size; train/stallstate.py ``under_way``) with every
    rank of its group for quiet_s seconds, none progressing."""
    group, seq, size = call
    return (f"no rank progressed for {quiet_s:.0f} s, and every rank that waits is inside collective #{seq} of "
            f"group {group} together with all {size} ranks of its group: the backend is working on it (a slow "
            f"collective on a loaded machine), so this is no hang (--stall-s {stall_s:g} ends a job only while a "
            f"rank waits for a peer that is elsewhere); the process group's timeout ends it if it never completes")


_FP = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+), "
                 r"TensorShape=\[([^\]]*)\], TensorDtypes=(\w+)")


def fingerprint_mismatch(text: str, rank: int) -> str | None:
    """torch's TORCH_DISTRIBUTED_DEBUG=DETAIL error (``Detected mismatch between collectives on
    ranks. Rank 0 is running collective: CollectiveFingerPrint(...), but Rank 1 is running ...``,
    its ranks counted in the group) as one line naming both sides; None for any other text.
    rank: the global rank that raised it (torch names it first)."""
    sides = _FP.findall(text or "")
    if len(sides) < 2 or "Detected mismatch between collectives" not in text:
        return None
    (mine, seq, op, shape, dtype), (other, _, op2, shape2, dtype2) = sides[:2]

    def call(o: str, s: str, d: str) -> str:
        return f"{o.lower().replace('allreduce', 'all_reduce').replace('allgather', 'all_gather')} [{s}] {d.lower()}"

    return (f"MISMATCH in collective #{int(seq) + 1} of rank {rank}'s group: rank {rank} (group rank {mine}) runs "
            f"{call(op, shape, dtype)}, group rank {other} runs {call(op2, shape2, dtype2)}")
