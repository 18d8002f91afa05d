"""The summary ``launcher up`` prints when a cluster has ended: the record of
observe/summary_record.py (what RUN_DIR/summary.json holds) rendered as rows: metrics, traffic,
report, every node's exit code and reason, lost nodes, a hang's diagnosis and the ranks that failed
with their tracebacks.

    python -m launcher up --mesh 2x1x1 --model tiny --steps 3     # ends with "== summary: OK =="

Rules: a row is shown only when its value is known; the user's code without tokens/s gets a ``step
time`` row; a job that logged no step gets one ``metrics`` row saying where they would come from.
``rank output`` counts the ranks whose output reached the launcher (torchrun prefixes each line of
rank R with ``[rankR]:``): a rank that printed nothing is named as such, not as missing, and only
ranks that printed are checked for their node (MISPLACED). A stall (train/stallwatch.py) shows its
diagnosis in ``HANG`` rows. A failed rank is named with its exception and last frames
(launcher/observe/failures.py), and a hint where one is known (a missing module, a known torch bug, a
torch.compile failure; a hint already shown under another rank is referred to, not repeated). A rank that aborted at exit in C++ (gloo's teardown) after its work was done does not
fail the run: the summary names it, its last step and that its work was done (observe/teardown.py).
"""
from __future__ import annotations

import os

from simcluster.launcher.container.layout import RDZV_HOST
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.observe.failures import PEER_FAILED, PEER_TIMEOUT, failure_hint
from simcluster.launcher.observe.follow import Stream
from simcluster.launcher.observe.summary_record import compute
from simcluster.launcher.observe.teardown import TEARDOWN_ABORT, show_aborted
from simcluster.core.hang_diagnosis import fingerprint_mismatch
from simcluster.core.layout import format_ranks, node_of, node_ranks
from simcluster.core.metrics import traffic_text
from simcluster.core.rundir import METRICS
from simcluster.core.runlog import write_summary
from simcluster.core.hang import HANG_FILE, STACKS_DIR

GLOO_MISMATCH = "Received data size doesn't match expected size"


def summarise(stream: Stream, launch: Launch, run_dir: str, codes: dict, wall: float, since: float = 0.0) -> bool:
    """Print the summary of an ended run and write RUN_DIR/summary.json (codes: service -> exit code;
    wall: seconds since the command's start; since: UNIX time the run started, older run-folder files
    are a previous run's); returns whether every node exited 0 and none was lost. A job of your code
    that ended so without a step, a printed loss or a single collective is headlined NO WORK, not OK."""
    record = compute(stream, launch, run_dir, codes, wall, since)
    for line in render(record, launch, run_dir):
        stream.show(line)
    stream.log.close()
    write_summary(run_dir, record)
    return record["ok"]


def render(record: dict, launch: Launch, run_dir: str) -> list[str]:
    """The summary's lines, from its record (summary_record.compute) and the job's Launch."""
    return [f"== summary: {record['headline']} ==", *_run_rows(record, launch, run_dir),
            *_metric_rows(record, launch), *_node_rows(record, launch), *_fault_rows(record, launch)]


def _run_rows(record: dict, launch: Launch, run_dir: str) -> list[str]:
    out = []
    if record["no_work"]:
        out.append(f"  NO WORK      every rank exited 0 without a step or a collective: nothing was trained or "
                   f"communicated (did your code find what it needs, GPUs or data, and exit early? its output: "
                   f"{launch.run_dir}/cluster.log)")
    out.append(f"  run folder   {launch.run_dir}")
    if launch.requirements:
        out.append(f"  image        {launch.node.image} (FROM the trainer image, with your requirements)")
    out.append(f"  wall time    {record['wall_s']:.1f}s (launcher, up to last exit)"
               + (f"; trainer wall_s {record['trainer_wall_s']}" if record["trainer_wall_s"] else ""))
    if record["first_output_s"] is not None:
        out.append(f"  first rank output after {record['first_output_s']:.1f}s")
    if record["final_loss"] is not None:
        out.append(f"  final loss   {record['final_loss']}"
                   + (f" after {record['steps']} steps" if record["steps"] is not None else "")
                   + (f" (as rank {record['printed_by']} printed it)" if record["printed_by"] is not None else ""))
    elif record["printed_error"]:
        out.append(f"  final loss   none read: --metric-regex {record['printed_error']}")
    elif record["steps"] is not None:
        out.append(f"  steps        {record['steps']}, without a loss" + ("" if launch.train is not None else
                   " (for one: simcluster.log(loss=...) or a \"loss\" in your metrics.jsonl)"))
    else:
        out += [f"  {'metrics' if i == 0 else '':<12} {line}" for i, line in enumerate(_no_metrics(launch, run_dir))]
    if data := record["data"]:
        out.append(f"  data         {data.get('name')}, {data.get('bytes')} bytes, sha256 {str(data.get('sha256_head'))[:12]}")
    return out


def _metric_rows(record: dict, launch: Launch) -> list[str]:
    out = []
    if record["tokens_per_s"] is not None:
        out.append(f"  tokens/s     {record['tokens_per_s']}")
    elif launch.train is None and record["step_time_s"] is not None:
        out.append(f"  step time    {record['step_time_s']:.3f}s (median after step 1, slowest rank)"
                   + (f"; peak RSS {record['rss_mb']:.0f} MB (any rank)" if record["rss_mb"] else ""))
    if (gpus := _gpus(launch)) is not None:
        out.append(f"  simulated GPUs: {gpus}")
    if record["device_peak_mb"]:
        out.append(f"  GPU memory   peak of each rank's tensors (max_memory_allocated), ranks "
                   f"{_peaks(record['device_peak_mb'])} (every tensor the rank allocates, torch.compile's buffers "
                   f"included); at full size: python -m launcher plan --full-size (docs/plan.md)")
    if record["traffic"]:
        out.append(f"  traffic/step {traffic_text(record['traffic'], launch.node_hosts)} (all ranks; per rank: "
                   f"{launch.run_dir}/traffic/)")
    if record["trace"]:
        out.append(f"  trace        {launch.run_dir}/trace.json (open in https://ui.perfetto.dev)")
    if record["report"]:
        out.append(f"  report       {record['report']}")
    if record["printed_ranks"] is not None:  # a Slurm job's one output file names no rank
        out.append(f"  rank output  {_rank_output(record['printed_ranks'], launch.world_size)}"
                   + ("" if not record["misplaced"] else "; MISPLACED: " + "; ".join(record["misplaced"])))
    return out


def _node_rows(record: dict, launch: Launch) -> list[str]:
    out = []
    for k, name in enumerate(launch.names):
        reason = record["node_reasons"].get(name)
        on = f" on {record['hosts'][name]}" if name in record["hosts"] else ""
        out.append(f"  {name:<11}  ranks {format_ranks(node_ranks(k, launch.nproc_per_node)):<8} "
                   f"exit {record['nodes'].get(name)}{on}" + (f" ({reason})" if reason else ""))
    if record["has_rendezvous"]:  # engines with the static rendezvous (Slurm) have no rendezvous container
        on = f" on {record['hosts'][RDZV_HOST]}" if RDZV_HOST in record["hosts"] else ""
        out.append(f"  {RDZV_HOST:<11}  {'':<14} exit {record['rendezvous']}{on}")
    for host, gone in record["lost_hosts"].items():
        out.append(f"  LOST HOST    {host}: its engine stopped answering; {', '.join(gone) or 'no node'} went with it")
    for lost in record["lost"]:
        out.append(f"  LOST         {lost}" + (f" (named {record['lost_s']:.1f}s after start, t={record['lost_t']:.3f})"
                                                   if record["lost_s"] else ""))
    if record["timed_out"]:
        out.append(f"  TIMED OUT    after {record['timed_out']:g}s (--wall-timeout-s): up killed every container")
    elif record["killed_by_up"]:
        out.append(f"  killed by up {', '.join(record['killed_by_up'])} (lost, or still up after the rendezvous ended)")
    return out


def _fault_rows(record: dict, launch: Launch) -> list[str]:
    out = [f"  {'HANG' if i == 0 else '':<12} {line.removeprefix('HANG ')}" for i, line in enumerate(record["hang"] or [])]
    if record["hang"]:
        out.append(f"  {'':<12} every rank's stack: {launch.run_dir}/{STACKS_DIR}/rank-N.txt; records: "
                   f"{launch.run_dir}/{HANG_FILE}")
    show_aborted(out.append, launch, {a["rank"]: a["after_step"] for a in record["aborted_at_exit"]})
    if not record["ok"]:
        tracebacks = {f["rank"]: f["lines"] for f in record["failed"]}
        _show_mismatch(out.append, tracebacks)
        if not record["hang"]:  # after a hang, ranks' errors are its consequences (their peers left): cluster.log has them
            _show_failures(out.append, launch, tracebacks)
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
            + (f", {inst.gpu_memory / 2**30:.2f} GiB each (--gpu-memory)" if inst.gpu_memory else "")
            + (", mixed devices and nccl on CPU tensors refused (--check-devices)" if inst.check_devices else ""))


def _peaks(peaks: dict) -> str:
    """rank -> MiB as "ranks 0-3 1.25 MiB, 4-7 0.98 MiB" (ranks of one value together)."""
    by: dict = {}
    for rank, mb in sorted(peaks.items()):
        by.setdefault(mb, []).append(rank)
    return ", ".join(f"{_spans(ranks)} {mb} MiB" for mb, ranks in sorted(by.items(), key=lambda kv: kv[1][0]))


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


def _rank_output(printed: list[int], world_size: int) -> str:
    """``4/4 ranks printed``, or which ranks printed nothing (a rank is known by torchrun's
    ``[rankR]:`` prefix on its lines: one that prints nothing is never seen)."""
    silent = [r for r in range(world_size) if r not in set(printed)]
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


def _show_failures(show, launch: Launch, tracebacks: dict[int, list[str]]) -> None:
    """The ranks that raised, with their traceback's last lines; ranks that only saw a peer die
    (connection closed) are named in one line after the cause; no traceback at all is said so."""
    if not tracebacks:
        show(f"  no rank printed a Python traceback or a C++ abort; each rank's output: {launch.run_dir}/cluster.log")
        return
    cause = {r: lines for r, lines in tracebacks.items() if not PEER_FAILED.search(lines[-1])}
    hinted: dict[str, int] = {}  # a hint shown -> the rank it was shown under: later ranks refer to it
    for rank, lines in (cause or tracebacks).items():
        waited = " (timed out waiting for a peer)" if PEER_TIMEOUT.search(lines[-1]) else ""
        show(f"  FAILED rank {rank} on {launch.names[node_of(rank, launch.nproc_per_node)]}{waited}: {lines[-1]}")
        for line in lines[:-1]:
            show(f"      {line}")
        if (fix := failure_hint(lines)) is not None:
            show(f"      (the same as rank {hinted[fix]}'s above)" if fix in hinted else f"      ({fix})")
            hinted.setdefault(fix, rank)
        if lines[-1].startswith(TEARDOWN_ABORT):
            show("      (SIGABRT: a C++ thread outlived the interpreter, gloo's teardown race when it comes after the "
                 "last step; the launcher counts it as done only when it knows the last step: --total-steps N, or "
                 "a \"total_steps\" your code logs; free what holds process groups after destroy_process_group: "
                 "`del model; gc.collect()`, see README)")
    after = sorted(set(tracebacks) - set(cause)) if cause else []
    if after:
        show(f"  then failed  rank(s) {', '.join(map(str, after))}: a peer's connection closed")
