"""The summary of an ended run as data: computed once from the log stream, the run folder and the
exit codes; RUN_DIR/summary.json holds it, and observe/summary.py renders it.

    python -m launcher up --mesh 2x1x1 --model tiny --steps 3 && python -c "import json; print(json.load(open('runs/mesh-2x1x1/summary.json'))['final_loss'])"

Rules: ``final_loss`` and ``tokens_per_s`` come from the trainer's ``done`` line, else from the
run's step rows (rundir.step_rows: metrics.jsonl joined with the instruments' records of the user's
code), else from the loss a rank printed (runlog.printed_series: --metric-regex, else the common
formats, training lines only); the user's code gets a step time (the median after step 1 of the
slowest rank) and the peak RSS of any rank; its traced steps are merged into trace.json and the
report is written here. A job of your code that exited 0 without a step, a printed loss or a
single collective is NO WORK. A stall (train/stallwatch.py) is read from RUN_DIR/hang.json. The
first failed node is the node of the rank whose own failure came first (log time), a rank that only
saw a peer leave or timed out waiting for one counting after every other (failures.PEER_FAILED,
PEER_TIMEOUT); a node row that a verdict blamed on another node names that node instead.
"""
from __future__ import annotations

import os
import posixpath
import re

from simcluster.launcher.container.layout import RDZV_HOST
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.observe.failures import PEER_FAILED, PEER_TIMEOUT, torch_bug
from simcluster.launcher.observe.follow import Stream
from simcluster.launcher.observe.teardown import aborted_after_work
from simcluster.core.layout import node_of
from simcluster.core.metrics import host_links
from simcluster.core.rundir import METRICS, collectives, step_rows
from simcluster.core.runlog import printed_series, read_data
from simcluster.core.hang import read_hang

BLAME = re.compile(r"^(\S+) \(ranks [^)]*\) failed with exit -?\d+")  # a node stopped for the verdict's failed node


def final_metrics(run_dir: str, done: dict, since: float, metric_regex: str | None = None) -> dict:
    """final_loss / tokens_per_s / wall_s / steps from the done line, else metrics.jsonl's last row (of
    a file written since ``since``: not a previous run's in a reused folder), else the last loss a
    rank printed (printed_by: that rank); traffic (the last row's totals), step_time_s, rss_mb and
    device_peak_mb from the rows. The file is read once."""
    out = {k: done.get(k) for k in ("final_loss", "tokens_per_s", "wall_s", "steps")}
    rows = step_rows(run_dir, since=since)
    if out["final_loss"] is None and rows:
        out.update(final_loss=next((r["loss"] for r in reversed(rows) if r.get("loss") is not None), None),
                   tokens_per_s=rows[-1].get("tokens_per_s"), steps=rows[-1].get("step"))
    out["traffic"] = next((r["traffic"] for r in reversed(rows) if r.get("traffic")), None)
    times = sorted(r["step_time_s"] for r in rows[1:] if isinstance(r.get("step_time_s"), (int, float)))
    out["step_time_s"] = times[len(times) // 2] if times else None
    rss = [x for r in rows for x in (r.get("rss_mb") or []) if isinstance(x, (int, float))]
    out["rss_mb"] = max(rss) if rss else None
    out["device_peak_mb"] = next((r["device_peak_mb"] for r in reversed(rows) if r.get("device_peak_mb")), None)
    out["printed_by"] = out["printed_error"] = None
    if out["final_loss"] is None:  # a loss the ranks only printed (--metric-regex, else the common formats)
        try:
            rank, printed = printed_series(run_dir, metric_regex)
        except ValueError as e:  # --metric-regex met a non-number: said in the summary
            rank, printed, out["printed_error"] = None, [], str(e)
        if printed:
            out.update(final_loss=printed[-1][1], printed_by=rank)
            out["steps"] = out["steps"] if out["steps"] is not None else printed[-1][0]
    return out


def no_work(launch: Launch, run_dir: str, since: float, m: dict) -> bool:
    """Your code's job made no step, printed no loss, and every rank counted no collective and no
    send or recv (launcher/instrument/work.py's records; without one for every rank, nothing is claimed)."""
    if launch.train is not None or m["steps"] is not None or m["final_loss"] is not None:
        return False
    counts = collectives(run_dir, since)
    return len(counts) == launch.world_size and not any(counts.values())


def first_failed(stream: Stream, launch: Launch, tracebacks: dict[int, list[str]]) -> tuple[str, int] | None:
    """(node, rank) of the rank whose own failure came first (its traceback or abort complete, by the
    time its line was written), a rank that saw a peer's connection close or timed out waiting for a
    peer only after every other; None without any."""
    ranks = [r for r in tracebacks if r in stream.failed_at]
    if not ranks:
        return None

    def order(r: int) -> tuple:
        last = tracebacks[r][-1]
        return bool(PEER_FAILED.search(last) or PEER_TIMEOUT.search(last)), stream.failed_at[r], r

    rank = min(ranks, key=order)
    return launch.names[node_of(rank, launch.nproc_per_node)], rank


def node_reason(name: str, code, reason: str | None, first: tuple[str, int] | None) -> str | None:
    """A failed node's reason, blaming the node that failed first: the node a verdict named is the one
    that reported first, not always the one whose rank failed first (a node whose ranks only saw the
    other's die may report sooner); lost, frozen and stopped nodes keep their own reason."""
    if first is None or code in (0, None) or (reason is not None and not BLAME.match(reason)):
        return reason
    node, rank = first
    return f"its rank {rank} failed first" if name == node else f"{node} failed first"


def merge_trace(launch: Launch, run_dir: str) -> None:
    """The user's code: merge the ranks' traced steps into RUN_DIR/trace.json (the trainer's rank 0
    merges its own); a trace that cannot be merged does not fail the run."""
    if launch.train is not None or not launch.instruments.trace_steps:
        return
    from simcluster.core.timeline import merge

    try:
        merge(run_dir, launch.world_size, launch.nproc_per_node)
    except (OSError, ValueError):
        pass


def write_report(launch: Launch, run_dir: str, metric_regex: str | None = None) -> str:
    """Write the run's report (observe/report.py, about a second) and return its page as the user
    names the run folder; a report that cannot be drawn does not fail the run (the text says so)."""
    from simcluster.launcher.observe.report import make_report

    try:
        page, _ = make_report(run_dir, metric_regex)
    except Exception as e:  # noqa: BLE001 - a plot problem must not turn a good run into a failure
        return f"not written ({type(e).__name__}: {e}); python -m launcher report --run-dir {launch.run_dir}"
    return posixpath.join(launch.run_dir, os.path.relpath(page, run_dir))


def compute(stream: Stream, launch: Launch, run_dir: str, codes: dict, wall: float, since: float = 0.0) -> dict:
    """The summary record of an ended run (codes: service -> exit code; wall: seconds since the
    command's start; since: UNIX time the run started). Its keys: headline (OK, NO WORK, HANG,
    FAILED), ok, no_work, hang (the diagnosis lines, or null), the outcome (``_outcome``), and the
    metrics (``final_metrics``: final_loss, steps, tokens_per_s, wall_s, step_time_s, rss_mb,
    device_peak_mb, printed_by, printed_error: a --metric-regex that met a non-number, traffic), data (the
    corpus's identity rank 0 wrote: core/runlog.py read_data, or null), report (the page, or why it was not written), trace."""
    ok = all(codes.get(n) == 0 for n in launch.names) and not (stream.lost or stream.timed_out or stream.lost_hosts)
    merge_trace(launch, run_dir)
    m = final_metrics(run_dir, stream.progress.done, since, stream.metric_regex)
    idle = ok and no_work(launch, run_dir, since, m)
    tracebacks = stream.tracebacks()
    aborted = {} if ok else aborted_after_work(stream, launch, run_dir, codes, tracebacks, since)
    ok = ok or bool(aborted)  # ranks that aborted at exit after their work explain the failure: not one
    hang = read_hang(run_dir, since) if not ok else None  # a stall: no rank failed first, every rank stopped
    first = None if ok or hang else first_failed(stream, launch, tracebacks)
    record = {"headline": "NO WORK" if idle else "OK" if ok else "HANG" if hang else "FAILED", "ok": ok,
              "no_work": idle, "hang": hang["diagnosis"] if hang else None,
              "first_failed": first[0] if first else None, "first_failed_rank": first[1] if first else None,
              **{k: m[k] for k in ("final_loss", "steps", "tokens_per_s", "step_time_s", "rss_mb", "printed_by",
                                   "printed_error")}, "data": read_data(run_dir, since) or None,
              "trainer_wall_s": m["wall_s"], "device_peak_mb": m["device_peak_mb"], "traffic": m["traffic"],
              "aborted_at_exit": [{"rank": r, "node": launch.names[node_of(r, launch.nproc_per_node)],
                                   "after_step": s} for r, s in aborted.items()]}
    record.update(_outcome(launch, stream, codes, ok, wall, m, tracebacks, first))
    record["trace"] = os.path.isfile(os.path.join(run_dir, "trace.json"))
    wrote = os.path.isfile(os.path.join(run_dir, METRICS)) or (launch.train is None and m["steps"] is not None)
    record["report"] = write_report(launch, run_dir, stream.metric_regex) if wrote else None
    return record


def _outcome(launch: Launch, stream: Stream, codes: dict, ok: bool, wall: float, m: dict,
             tracebacks: dict[int, list[str]], first: tuple[str, int] | None) -> dict:
    """The outcome part of the record (what ``simcluster.run``'s Run reads): timed_out (the
    --wall-timeout-s, or null), wall_s, each node's exit code (nodes) and reason (node_reasons), the
    rendezvous', the lost nodes' lines, the containers up killed, each rank that printed a traceback
    when the run failed (rank, node, its node's exit code, the traceback's last lines, the exception
    last, whether it only saw a peer's connection close: peer_failed, and the name of the known torch bug its
    traceback matches, failures.TORCH_BUGS: torch_bug, or null); the network
    (inter_node_bandwidth), the image every node ran; with rehearsal hosts (up --hosts) the host of
    each container (hosts), the hosts that stopped answering (lost_hosts), the last step's bytes per
    host pair (host_traffic, or null) and --inter-host-bandwidth; the first rank output's time, and
    which ranks printed (printed_ranks, or null for a job whose output names no rank)."""
    def failed(rank: int, lines: list[str]) -> dict:
        node = launch.names[node_of(rank, launch.nproc_per_node)]
        bug = torch_bug(lines)
        return {"rank": rank, "node": node, "exit": codes.get(node), "lines": lines,
                "peer_failed": bool(PEER_FAILED.search(lines[-1])), "torch_bug": bug.name if bug else None}

    return {"timed_out": stream.timed_out, "wall_s": round(wall, 3), "nodes": {n: codes.get(n) for n in launch.names},
            "node_reasons": {n: node_reason(n, codes.get(n), stream.reasons.get(n), first) for n in launch.names},
            "rendezvous": codes.get(RDZV_HOST) if RDZV_HOST in codes else None, "has_rendezvous": RDZV_HOST in codes,
            "lost": list(stream.lost), "lost_s": stream.lost_s, "lost_t": stream.lost_t,
            "killed_by_up": list(stream.forced), "failed": [failed(r, lines) for r, lines in sorted(tracebacks.items())
                                                            if not ok],
            "inter_node_bandwidth": launch.node.inter_node_bandwidth, "image": launch.node.image,
            "hosts": dict(stream.placed), "lost_hosts": dict(stream.lost_hosts),
            "host_traffic": host_links(m["traffic"], launch.node_hosts) if m["traffic"] and launch.node_hosts else None,
            "inter_host_bandwidth": launch.engine.inter_host_bandwidth, "first_output_s": stream.first_worker_s,
            "printed_ranks": sorted(stream.seen_ranks) if stream.per_rank else None, "misplaced": list(stream.misplaced)}
