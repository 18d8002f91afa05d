"""A rank that aborted at exit in C++ after its work was done: told from a failure, and named.

    python -c "from simcluster.launcher.observe.teardown import TEARDOWN_ABORT; print(TEARDOWN_ABORT)"

torch's gloo threads can outlive a rank's interpreter as it tears down and abort it with SIGABRT
(libstdc++'s ``terminate called without an active exception``: a joinable std::thread destroyed)
after its last step. torchrun reports the rank failed (exit -6), its node exits 1 and, before this
rule, ``up`` said FAILED for a run whose work was all done. The summary (observe/summary.py) now
counts such a run as done and names each such rank, its last step and that its work was done; a
rank that aborts before the run's last step, or a run whose last step the launcher cannot know,
still fails, with how it would know (``--total-steps``).
"""
from __future__ import annotations

from simcluster.launcher.job.launch import Launch
from simcluster.launcher.observe.follow import Stream
from simcluster.core.layout import node_of
from simcluster.core.rundir import rank_last_steps, step_rows

TEARDOWN_ABORT = "terminate called without an active exception"  # std::terminate with no exception: a joinable thread


def aborted_after_work(stream: Stream, launch: Launch, run_dir: str, codes: dict, tracebacks: dict,
                       since: float) -> dict[int, int]:
    """rank -> its last step, for ranks whose only failure is a C++ abort at exit after their work was
    done, when they explain the whole failure; {} otherwise (the run failed). The rules: nothing lost or
    timed out; every rank that failed printed only TEARDOWN_ABORT (no Python traceback); each reached
    the run's last step (its own step record, steps/rank-R.jsonl, at the job's last step: --total-steps,
    or a "total_steps" it logged; the trainer: rank 0's ``done`` line after its last step, which every
    rank's collectives reached); every node that failed exited 1 (torchrun's child failure) and holds
    one of them. tracebacks: Stream.tracebacks()."""
    if stream.lost or stream.timed_out or stream.lost_hosts or not tracebacks:
        return {}
    if any(lines != [TEARDOWN_ABORT] for lines in tracebacks.values()):
        return {}
    if launch.train is not None:
        done = stream.progress.done.get("steps")
        ended = str(done) == str(launch.train.config.steps)  # the done line's fields are text
        last = {r: launch.train.config.steps for r in tracebacks} if ended else {}
    else:
        steps = rank_last_steps(run_dir, since)
        logged = [r["total_steps"] for r in step_rows(run_dir, since=since) if isinstance(r.get("total_steps"), int)]
        end = launch.instruments.total_steps or (logged[-1] if logged else None)  # unknown: no step is the last
        last = {r: steps[r] for r in tracebacks if r in steps and end is not None and steps[r] >= end}
    if len(last) != len(tracebacks):
        return {}
    nodes = {launch.names[node_of(r, launch.nproc_per_node)] for r in last}
    if any(codes.get(n) != 0 and (codes.get(n) != 1 or n not in nodes) for n in launch.names):
        return {}
    return dict(sorted(last.items()))


def show_aborted(show, launch: Launch, aborted: dict[int, int]) -> None:
    """One line per rank of ``aborted_after_work``: which rank on which node, the abort, its last step."""
    for rank, step in aborted.items():
        show(f"  rank {rank} on {launch.names[node_of(rank, launch.nproc_per_node)]} aborted at exit (SIGABRT in gloo "
             f"teardown: '{TEARDOWN_ABORT}', a C++ thread outliving the interpreter) after its last step {step}; its "
             f"work was done")
