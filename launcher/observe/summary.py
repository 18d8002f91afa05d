"""The summary ``launcher up`` prints when a cluster has ended: metrics, traffic, report, every
node's exit code and reason, lost nodes and the ranks that failed with their tracebacks.

    python -m launcher up --mesh 2x1x1 --model tiny --steps 3     # ends with "== summary: OK =="

Rules: a row is shown only when its value is known. ``final loss`` and ``tokens/s`` come from the
trainer's ``done`` line, else from the run's step rows (rundir.step_rows: metrics.jsonl joined
with the instruments' records of the user's code); the user's code without tokens/s gets a ``step
time`` row (the median after step 1 of the slowest rank, and the peak RSS of any rank); its traced
steps are merged into trace.json here; a job that logged no step gets one ``metrics`` row saying
where they would come from. ``rank output`` counts the ranks whose output
reached the launcher (torchrun prefixes each line of rank R with ``[rankR]:``): a rank that printed
nothing is named as such, not as missing, and only ranks that printed are checked for their node
(MISPLACED). A stall (train/stallwatch.py) shows its diagnosis from RUN_DIR/hang.json in
``HANG`` rows. A failed rank is named with its exception and last frames (launcher/observe/failures.py).
A rank that aborted at exit in C++ (gloo's teardown) after its work was done does not fail the run:
the summary names it, its last step and that its work was done (observe/teardown.py).
"""
from __future__ import annotations

import os
import posixpath
import re

from simcluster.launcher.observe.failures import PEER_FAILED, PEER_TIMEOUT, missing_module_hint
from simcluster.launcher.observe.follow import Stream
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.observe.teardown import TEARDOWN_ABORT, aborted_after_work, show_aborted
from simcluster.core.rundir import METRICS, collectives, step_rows
from simcluster.core.runlog import printed_series, read_data, write_summary
from simcluster.launcher.container.layout import RDZV_HOST
from simcluster.core.layout import format_ranks, node_of, node_ranks
from simcluster.core.metrics import host_links, traffic_text
from simcluster.core.hang import HANG_FILE, STACKS_DIR, read_hang
from simcluster.core.hang_diagnosis import fingerprint_mismatch

GLOO_MISMATCH = "Received data size doesn't match expected size"

BLAME = re.compile(r"^(\S+) \(ranks [^)]*\) failed with exit -?\d+")  # a node stopped for the verdict's failed node


def _final_metrics(run_dir: str, done: dict, since: float, metric_regex: str | None = None) -> dict:
    """final_loss / tokens_per_s / wall_s from the done line, else metrics.jsonl's last row (of a
    file written since ``since``: not a previous run's in a reused folder), else the last loss a
    rank printed (runlog.printed_series: metric_regex, else the common formats; printed_by: that
    rank); and the ``traffic`` totals of the last row that has them (``--traffic 1``). The file is read once."""
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
    out["printed_by"] = None
    out["printed_error"] = None
    if out["final_loss"] is None:  # a loss the ranks only printed (--metric-regex, else the common formats)
        try:
            rank, printed = printed_series(run_dir, metric_regex)
        except ValueError as e:  # --metric-regex met a non-number: said in the summary
            rank, printed, out["printed_error"] = None, [], str(e)
        if printed:
            out.update(final_loss=printed[-1][1], printed_by=rank)
            out["steps"] = out["steps"] if out["steps"] is not None else printed[-1][0]
    return out


def _gpus(launch: Launch) -> str | None:
    """The "simulated GPUs" row: how many a node, what is mapped, the model (user code only)."""
    inst = launch.instruments
    if launch.train is not None or inst is None or not inst.simulated_gpus:
        return None
    from simcluster.launcher.instrument.gpu.install import SUMMARY
    from simcluster.core.hardware import GPU_ALIASES, HARDWARE
    return (f"{launch.nproc_per_node} a node ({SUMMARY}), "
            f"{HARDWARE[GPU_ALIASES.get(inst.gpu, inst.gpu)].device_name} (--gpu {inst.gpu})"
            + (f", {inst.gpu_memory / 2**30:.2f} GiB each (--gpu-memory)" if inst.gpu_memory else ""))


def _peaks(peaks: dict) -> str:
    """rank -> MiB as "ranks 0-3 1.25 MiB, 4-7 0.98 MiB" (ranks of one value together)."""
    by: dict = {}
    for rank, mb in sorted(peaks.items()):
        by.setdefault(mb, []).append(rank)
    return ", ".join(f"{_spans(ranks)} {mb} MiB" for mb, ranks in sorted(by.items(), key=lambda kv: kv[1][0]))


def _no_work(launch: Launch, run_dir: str, since: float, m: dict) -> bool:
    """Your code's job made no step, printed no loss, and every rank counted no collective and no
    send or recv (launcher/instrument/work.py's records; without one for every rank, nothing is claimed)."""
    if launch.train is not None or m["steps"] is not None or m["final_loss"] is not None:
        return False
    counts = collectives(run_dir, since)
    return len(counts) == launch.world_size and not any(counts.values())


def _first_failed(stream: Stream, launch: Launch, tracebacks: dict[int, list[str]]) -> tuple[str, int] | None:
    """(node, rank) of the rank whose traceback (or abort) came first, a cause before a rank that only
    saw a peer's connection close (failures.PEER_FAILED); None without any."""
    ranks = [r for r in tracebacks if r in stream.failed_at]
    cause = [r for r in ranks if not PEER_FAILED.search(tracebacks[r][-1])] or ranks
    if not cause:
        return None
    rank = min(cause, key=lambda r: (stream.failed_at[r], r))
    return launch.names[node_of(rank, launch.nproc_per_node)], rank


def _node_reason(name: str, code, reason: str | None, first: tuple[str, int] | None) -> str | None:
    """A failed node's reason, blaming the node that failed first: the node a verdict named is the one
    that reported first, not always the one whose rank failed first (a node whose ranks only saw the
    other's die may report sooner); lost, frozen and stopped nodes keep their own reason."""
    if first is None or code in (0, None) or (reason is not None and not BLAME.match(reason)):
        return reason
    node, rank = first
    return f"its rank {rank} failed first" if name == node else f"{node} failed first"


def _merge_trace(launch: Launch, run_dir: str) -> None:
    """The user's code: merge the ranks' traced steps into RUN_DIR/trace.json (the trainer's rank 0
    merges its own); a trace that cannot be merged does not fail the run."""
    if launch.train is not None or not launch.instruments.trace_steps:
        return
    from simcluster.core.timeline import merge

    try:
        merge(run_dir, launch.world_size, launch.nproc_per_node)
    except (OSError, ValueError):
        pass


def summarise(stream: Stream, launch: Launch, run_dir: str, codes: dict, wall: float, since: float = 0.0) -> bool:
    """Print the summary of an ended run (codes: service -> exit code; wall: seconds since the
    command's start; since: UNIX time the run started, older run-folder files are a previous
    run's); returns whether every node exited 0 and none was lost. A job of your code that ended
    so without a step, a printed loss or a single collective is headlined NO WORK, not OK."""
    ok = all(codes.get(n) == 0 for n in launch.names) and not (stream.lost or stream.timed_out or stream.lost_hosts)
    _merge_trace(launch, run_dir)
    m = _final_metrics(run_dir, stream.progress.done, since, stream.metric_regex)
    no_work = ok and _no_work(launch, run_dir, since, m)
    tracebacks = stream.tracebacks()
    aborted = {} if ok else aborted_after_work(stream, launch, run_dir, codes, tracebacks, since)
    ok = ok or bool(aborted)  # ranks that aborted at exit after their work explain the failure: not one
    show = stream.show
    hang = read_hang(run_dir, since) if not ok else None  # a stall: no rank failed first, every rank stopped
    show(f"== summary: {'NO WORK' if no_work else 'OK' if ok else 'HANG' if hang else 'FAILED'} ==")
    if no_work:
        show(f"  NO WORK      every rank exited 0 without a step or a collective: nothing was trained or "
             f"communicated (did your code find what it needs, GPUs or data, and exit early? its output: "
             f"{launch.run_dir}/cluster.log)")
    show(f"  run folder   {launch.run_dir}")
    if launch.requirements:
        show(f"  image        {launch.node.image} (FROM the trainer image, with your requirements)")
    show(f"  wall time    {wall:.1f}s (launcher, up to last exit)" + (f"; trainer wall_s {m['wall_s']}" if m["wall_s"] else ""))
    if stream.first_worker_s is not None:
        show(f"  first rank output after {stream.first_worker_s:.1f}s")
    if m["final_loss"] is not None:
        show(f"  final loss   {m['final_loss']}" + (f" after {m['steps']} steps" if m["steps"] is not None else "")
             + (f" (as rank {m['printed_by']} printed it)" if m["printed_by"] is not None else ""))
    elif m["printed_error"]:
        show(f"  final loss   none read: --metric-regex {m['printed_error']}")
    elif m["steps"] is not None:
        show(f"  steps        {m['steps']}, without a loss" + ("" if launch.train is not None else
             " (for one: simcluster.log(loss=...) or a \"loss\" in your metrics.jsonl)"))
    else:
        for i, line in enumerate(_no_metrics(launch, run_dir)):
            show(f"  {'metrics' if i == 0 else '':<12} {line}")
    if data := read_data(run_dir, since):
        show(f"  data         {data.get('name')}, {data.get('bytes')} bytes, sha256 {str(data.get('sha256_head'))[:12]}")
    if m["tokens_per_s"] is not None:
        show(f"  tokens/s     {m['tokens_per_s']}")
    elif launch.train is None and m["step_time_s"] is not None:
        show(f"  step time    {m['step_time_s']:.3f}s (median after step 1, slowest rank)"
             + (f"; peak RSS {m['rss_mb']:.0f} MB (any rank)" if m["rss_mb"] else ""))
    if (gpus := _gpus(launch)) is not None:
        show(f"  simulated GPUs: {gpus}")
    if m["device_peak_mb"]:
        show(f"  GPU memory   peak of each rank's tensors (max_memory_allocated), ranks {_peaks(m['device_peak_mb'])} "
             f"(every tensor the rank allocates, torch.compile's buffers included); "
             f"no prediction: the planner knows the built-in trainer's model only")
    if m["traffic"]:
        show(f"  traffic/step {traffic_text(m['traffic'], launch.node_hosts)} (all ranks; per rank: "
             f"{launch.run_dir}/traffic/)")
    if os.path.isfile(os.path.join(run_dir, "trace.json")):
        show(f"  trace        {launch.run_dir}/trace.json (open in https://ui.perfetto.dev)")
    if os.path.isfile(os.path.join(run_dir, METRICS)) or (launch.train is None and m["steps"] is not None):
        show(f"  report       {_report(launch, run_dir, stream.metric_regex)}")
    if stream.per_rank:  # each line tells its rank (torchrun's [rankR]: prefix); a Slurm job's one file does not
        show(f"  rank output  {_rank_output(stream, launch.world_size)}"
             + ("" if not stream.misplaced else "; MISPLACED: " + "; ".join(stream.misplaced)))
    first = None if ok or hang else _first_failed(stream, launch, tracebacks)
    for k, name in enumerate(launch.names):
        reason = _node_reason(name, codes.get(name), stream.reasons.get(name), first)
        why = f" ({reason})" if reason else ""
        on = f" on {stream.placed[name]}" if name in stream.placed else ""
        show(f"  {name:<11}  ranks {format_ranks(node_ranks(k, launch.nproc_per_node)):<8} exit {codes.get(name)}{on}{why}")
    if RDZV_HOST in codes:  # engines with the static rendezvous (Slurm) have no rendezvous container
        on = f" on {stream.placed[RDZV_HOST]}" if RDZV_HOST in stream.placed else ""
        show(f"  {RDZV_HOST:<11}  {'':<14} exit {codes.get(RDZV_HOST)}{on}")
    for host, gone in stream.lost_hosts.items():
        show(f"  LOST HOST    {host}: its engine stopped answering; {', '.join(gone) or 'no node'} went with it")
    for lost in stream.lost:
        show(f"  LOST         {lost}" + (f" (named {stream.lost_s:.1f}s after start, t={stream.lost_t:.3f})"
                                             if stream.lost_s else ""))
    if stream.timed_out:
        show(f"  TIMED OUT    after {stream.timed_out:g}s (--wall-timeout-s): up killed every container")
    elif stream.forced:
        show(f"  killed by up {', '.join(stream.forced)} (lost, or still up after the rendezvous ended)")
    for i, line in enumerate(hang["diagnosis"] if hang else []):
        show(f"  {'HANG' if i == 0 else '':<12} {line.removeprefix('HANG ')}")
    if hang:
        show(f"  {'':<12} every rank's stack: {launch.run_dir}/{STACKS_DIR}/rank-N.txt; records: "
             f"{launch.run_dir}/{HANG_FILE}")
    show_aborted(show, launch, aborted)
    if not ok:
        _show_mismatch(show, tracebacks)
        if not hang:  # after a hang, ranks' errors are its consequences (their peers left): cluster.log has them
            _show_failures(show, launch, tracebacks)
    stream.log.close()
    record = _record(launch, stream, codes, ok, wall, m, tracebacks)
    write_summary(run_dir, {**record, "data": data or None, "no_work": no_work, "first_failed": first[0] if first else None,
                            "aborted_at_exit": [{"rank": r, "node": launch.names[node_of(r, launch.nproc_per_node)],
                                                 "after_step": s} for r, s in aborted.items()],
                            "hang": hang["diagnosis"] if hang else None})
    return ok



def _record(launch: Launch, stream: Stream, codes: dict, ok: bool, wall: float, m: dict,
            tracebacks: dict[int, list[str]]) -> dict:
    """The summary as data (RUN_DIR/summary.json, runlog.read_summary; what ``simcluster.run``'s Run
    reads): ok, timed_out (the --wall-timeout-s, or null), wall_s, steps, final_loss, each node's
    exit code, the rendezvous', the lost nodes' lines, the containers up killed, and each rank that
    printed a traceback: rank, node, its node's exit code, the traceback's last lines (the
    exception last) and whether it only saw a peer's connection close (peer_failed); the
    network the run was measured on (inter_node_bandwidth: --inter-node-bandwidth, or null); the image
    every node ran (image: the trainer's, --image, or the derived image of --requirements); with rehearsal
    hosts (up --hosts) the host each container ran on (hosts: service -> host), the hosts that stopped
    answering with the services that went with them (lost_hosts), the last step's bytes per host pair
    (host_traffic: simcluster/core/metrics.py host_links, or null), and --inter-host-bandwidth; summarise adds
    no_work (the NO WORK headline) and first_failed (the node whose rank failed first, or null)."""
    def failed(rank: int, lines: list[str]) -> dict:
        node = launch.names[node_of(rank, launch.nproc_per_node)]
        return {"rank": rank, "node": node, "exit": codes.get(node), "lines": lines,
                "peer_failed": bool(PEER_FAILED.search(lines[-1]))}

    return {"ok": ok, "timed_out": stream.timed_out, "wall_s": round(wall, 3), "steps": m["steps"],
            "final_loss": m["final_loss"], "nodes": {n: codes.get(n) for n in launch.names},
            "rendezvous": codes.get(RDZV_HOST), "lost": list(stream.lost), "killed_by_up": list(stream.forced),
            "failed": [failed(r, lines) for r, lines in sorted(tracebacks.items()) if not ok],
            "inter_node_bandwidth": launch.node.inter_node_bandwidth, "image": launch.node.image,
            "hosts": dict(stream.placed), "lost_hosts": dict(stream.lost_hosts),
            "host_traffic": host_links(m["traffic"], launch.node_hosts) if m["traffic"] and launch.node_hosts else None,
            "inter_host_bandwidth": launch.engine.inter_host_bandwidth}


def _show_mismatch(show, tracebacks: dict[int, list[str]]) -> None:
    """A collective's mismatch, named on both sides (--check-collectives 1: torch's DETAIL check), or
    gloo's own answer to one (an abort: 'Received data size doesn't match') with the flag that names it."""
    for rank, lines in sorted(tracebacks.items()):
        if lines and (line := fingerprint_mismatch(lines[-1], rank)):
            show(f"  MISMATCH     {line.removeprefix('MISMATCH ')}")
            return
    if any(GLOO_MISMATCH in line for lines in tracebacks.values() for line in lines):
        show(f"  MISMATCH?    gloo saw a collective's sizes differ across ranks ({GLOO_MISMATCH!r}); rerun with "
             f"--check-collectives 1 to name both sides")


def _no_metrics(launch: Launch, run_dir: str) -> list[str]:
    """The ``metrics`` row of a job that logged no step: what is missing and where it would come from."""
    if os.path.isfile(os.path.join(run_dir, METRICS)):
        return [f"none: {launch.run_dir}/{METRICS} has no row with a \"step\""]
    if launch.train is not None:
        return [f"none: the trainer logged no step (no {METRICS})"]
    return [f"none: the job made no optimizer step and wrote no {METRICS} (steps are counted at each",
            "torch optimizer step or simcluster.step(); log a loss with simcluster.log(loss=...))"]


def _rank_output(stream: Stream, world_size: int) -> str:
    """``4/4 ranks printed``, or which ranks printed nothing (a rank is known by torchrun's
    ``[rankR]:`` prefix on its lines: one that prints nothing is never seen)."""
    silent = [r for r in range(world_size) if r not in stream.seen_ranks]
    if not silent:
        return f"{world_size}/{world_size} ranks printed"
    if len(silent) == world_size:
        return f"0/{world_size} ranks printed (none printed anything)"
    many = "s" if len(silent) > 1 else ""
    return f"{world_size - len(silent)}/{world_size} ranks printed (rank{many} {_spans(silent)} printed nothing)"


def _spans(ranks: list[int]) -> str:
    """``0, 2-5, 7`` for [0, 2, 3, 4, 5, 7] (sorted)."""
    out: list[str] = []
    for r in ranks:
        if out and int(out[-1].split("-")[-1]) == r - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def _report(launch: Launch, run_dir: str, metric_regex: str | None = None) -> str:
    """Write the run's report (launcher/report.py, about a second) and return its page as the user
    names the run folder; a report that cannot be drawn does not fail the run."""
    from simcluster.launcher.observe.report import make_report

    try:
        page, _ = make_report(run_dir, metric_regex)
    except Exception as e:  # noqa: BLE001 - a plot problem must not turn a good run into a failure
        return f"not written ({type(e).__name__}: {e}); python -m launcher report --run-dir {launch.run_dir}"
    return posixpath.join(launch.run_dir, os.path.relpath(page, run_dir))


def _show_failures(show, launch: Launch, tracebacks: dict[int, list[str]]) -> None:
    """The ranks that raised, with their traceback's last lines; ranks that only saw a peer die
    (connection closed) are named in one line after the cause; no traceback at all is said so."""
    if not tracebacks:
        show(f"  no rank printed a Python traceback or a C++ abort; each rank's output: {launch.run_dir}/cluster.log")
        return
    cause = {r: lines for r, lines in tracebacks.items() if not PEER_FAILED.search(lines[-1])}
    for rank, lines in (cause or tracebacks).items():
        waited = " (timed out waiting for a peer)" if PEER_TIMEOUT.search(lines[-1]) else ""
        show(f"  FAILED rank {rank} on {launch.names[node_of(rank, launch.nproc_per_node)]}{waited}: {lines[-1]}")
        for line in lines[:-1]:
            show(f"      {line}")
        if (fix := missing_module_hint(lines[-1])) is not None:
            show(f"      ({fix})")
        if lines[-1].startswith(TEARDOWN_ABORT):
            show("      (SIGABRT: a C++ thread outlived the interpreter, gloo's teardown race when it comes after the "
                 "last step; the launcher counts it as done only when it knows the last step: --total-steps N, or "
                 "a \"total_steps\" your code logs; free what holds process groups after destroy_process_group: "
                 "`del model; gc.collect()`, see README)")
    after = sorted(set(tracebacks) - set(cause)) if cause else []
    if after:
        show(f"  then failed  rank(s) {', '.join(map(str, after))}: a peer's connection closed")
