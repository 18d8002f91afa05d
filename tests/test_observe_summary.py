"""The summary without Docker: synthetic log lines through ``Stream.handle``, then ``summarise``.

    python -m pytest -q tests/test_observe_summary.py

Deep tracebacks (a hundred frames, on several ranks at once, interleaved) still name each rank
with its exception and last frames; the cause is told from ranks that only saw a peer die; a job
that logs no metrics and prints on some ranks only gets no ``?`` rows; a loss only printed is the
final loss (the training loss, not a validation line; a dict of tensors too); an exit 0 without a step
or a collective is NO WORK; each failed node's row names the node whose rank failed first, by the
time its container wrote the failure; a torch.compile failure gets its hint; a known torch bug
(failures.TORCH_BUGS) is named with its upstream links, a GPU's outcome and the workarounds.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simcluster.launcher.job.entry import resolve_code
from simcluster.launcher.job.launch import NodeOptions
from simcluster.launcher.observe.failures import FRAME_LINES, FRAMES_KEPT, RankTrace
from simcluster.launcher.observe.follow import Stream
from simcluster.launcher.observe.summary import summarise

ROOT = Path(__file__).resolve().parent.parent
DTENSOR = "/opt/venv/lib/python3.11/site-packages/torch/distributed/tensor/_dispatch.py"


@pytest.fixture
def stream(tmp_path):
    launch = resolve_code(NodeOptions(), script=str(ROOT / "examples" / "ddp.py"), nodes=2, nproc_per_node=2,
                          run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    s = Stream(launch, str(tmp_path / "run" / "cluster.log"), quiet=True, progress_every=10)
    yield s
    s.log.close()


def deep_traceback(rank: int, frames: int, exception: str) -> list[str]:
    """A rank's traceback as torch prints it: [rankR]: on each line, File/source/caret lines per frame."""
    lines = ["Traceback (most recent call last):"]
    for i in range(frames):
        lines += [f'  File "{DTENSOR}", line {i + 1}, in op_{i}', f"    return self._op_{i}(*args)",
                  "           ^^^^^^^^^^^^^^^^^^^^^"]
    return [f"[rank{rank}]:{x}" for x in lines + [exception]]


def feed_interleaved(stream: Stream, per_rank: dict[int, list[str]]) -> None:
    """One line of each rank in turn, as the containers' logs arrive mixed."""
    queues = {r: list(lines) for r, lines in per_rank.items()}
    while any(queues.values()):
        for r, q in queues.items():
            if q:
                stream.handle(f"node-{r // 2}", q.pop(0))


def summary_of(stream: Stream, codes: dict, capsys) -> str:
    capsys.readouterr()
    if stream.log.closed:  # summarise closes it: a second summary of one stream appends again
        stream.log = open(stream.log.name, "a", encoding="utf-8")
    summarise(stream, stream.launch, stream.launch.run_dir, codes, 12.0)
    return capsys.readouterr().out.split("== summary:", 1)[1]


def test_hundred_frame_tracebacks_on_every_rank_name_each_rank(stream, capsys):
    per_rank = {r: deep_traceback(r, 100, f"RuntimeError: aten.mm: shapes do not match on rank {r}") for r in range(4)}
    per_rank[1].insert(150, "[rank1]:a print of another thread, in the middle")  # not a frame, ignored
    feed_interleaved(stream, per_rank)
    tb = stream.tracebacks()
    assert sorted(tb) == [0, 1, 2, 3]
    for r in range(4):
        assert tb[r] == ["... 98 earlier frames", f'  File "{DTENSOR}", line 99, in op_98', "    return self._op_98(*args)",
                         f'  File "{DTENSOR}", line 100, in op_99', "    return self._op_99(*args)",
                         f"RuntimeError: aten.mm: shapes do not match on rank {r}"], tb[r]
        kept = stream.traces[r].done[0]
        assert len(kept) <= FRAMES_KEPT and all(len(f) <= FRAME_LINES for f in kept)  # memory: bounded
    out = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 0}, capsys)
    assert out.startswith(" FAILED ==")
    for r in range(4):
        assert f"  FAILED rank {r} on node-{r // 2}: RuntimeError: aten.mm: shapes do not match on rank {r}\n" in out
    assert "      ... 98 earlier frames\n" in out and "then failed" not in out


def test_deep_cause_then_peers_that_saw_it_die_or_timed_out(stream, capsys):
    per_rank = {0: deep_traceback(0, 120, "ValueError: bad batch"),
                1: deep_traceback(1, 60, "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
                2: deep_traceback(2, 80, "torch.distributed.DistBackendError: Broken pipe"),
                3: ["[rank3]:step 1/4 loss 0.5"] * 50}
    feed_interleaved(stream, per_rank)
    out = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 0}, capsys)
    assert "  FAILED rank 0 on node-0: ValueError: bad batch\n      ... 118 earlier frames\n" in out
    assert "  then failed  rank(s) 1, 2: a peer's connection closed" in out
    assert "FAILED rank 1" not in out and "FAILED rank 3" not in out

    t = RankTrace()  # only peer failures: each named, a timeout said so
    for x in deep_traceback(3, 3, "torch.distributed.DistNetworkError: wait timeout after 30000ms"):
        t.feed(x.split(":", 1)[1])
    stream.traces = {3: t}
    assert "FAILED rank 3 on node-1 (timed out waiting for a peer): torch.distributed.DistNetworkError" in \
        summary_of(stream, {"node-0": 1, "node-1": 1}, capsys)


def test_chained_cut_short_and_cxx_abort():
    t = RankTrace()
    for x in ["Traceback (most recent call last):", '  File "a.py", line 1, in f', "KeyError: 'x'", "",
              "During handling of the above exception, another exception occurred:", "",
              "Traceback (most recent call last):", '  File "a.py", line 3, in f', "    raise ValueError(x)",
              "ValueError: from the KeyError", "Traceback (most recent call last):", '  File "a.py", line 9']:
        t.feed(x)  # the last block is cut short: the latest complete one stands, with its chain's root cause
    assert t.lines() == ["root cause: KeyError: 'x'", '  File "a.py", line 3, in f', "    raise ValueError(x)",
                         "ValueError: from the KeyError"]

    abort = RankTrace()
    for x in ["terminate called without an active exception"] + [f"frame #{i}: libc.so" for i in range(200)]:
        abort.feed(x)  # far more than 40 lines after it
    assert abort.lines() == ["terminate called without an active exception"]
    abort.feed("Traceback (most recent call last):")
    abort.feed("SystemExit: 1")
    assert abort.lines() == ["SystemExit: 1"]  # a Python traceback comes first
    assert RankTrace().lines() is None


def test_cxx_abort_keeps_the_teardown_hint(stream, capsys):
    for x in ["[rank2]:step 4/4 loss 0.5", "[rank2]:terminate called without an active exception"] + \
            [f"[rank2]:frame #{i}: python() [0x53b6c7]" for i in range(60)]:
        stream.handle("node-1", x)
    out = summary_of(stream, {"node-0": 0, "node-1": 134, "rendezvous": 0}, capsys)
    assert "  FAILED rank 2 on node-1: terminate called without an active exception\n" in out
    assert "gloo's teardown race" in out


def test_a_missing_module_names_requirements_and_triton_its_cuda_wheels(stream, capsys):
    """torchtitan imports triton at start: the FAILED line says a CPU image lacks it and how to add it."""
    for rank, name in ((1, "triton"), (3, "wandb")):
        for x in ["Traceback (most recent call last):", '  File "/opt/venv/lib/python3.11/site-packages/torchtitan/'
                  'models/moe/kernels.py", line 8, in <module>', f"ModuleNotFoundError: No module named '{name}'"]:
            stream.handle(f"node-{rank // 2}", f"[rank{rank}]:{x}")
    out = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 0}, capsys)
    assert "      (triton: torch's CUDA wheels install it, the image's CPU torch does not; add triton==3.9.0 to " \
           "your --requirements file (it installs on CPU; a kernel it launches on the simulated GPU is refused))" in out
    assert "      (wandb: not in the image; add the package that provides it to your --requirements file)" in out


def test_script_without_metrics_printing_on_some_ranks(stream, capsys):
    """Every rank exited 0, no metrics.jsonl, ranks 1 and 3 printed nothing: no '?' row."""
    for service, line in [("node-0", "[rank0]:hello from 0"), ("node-1", "[rank2]:hello from 2"),
                          ("node-0", "a line of the node itself")]:
        stream.handle(service, line)
    out = summary_of(stream, {"node-0": 0, "node-1": 0, "rendezvous": 0}, capsys)
    assert out.startswith(" OK ==")
    assert "?" not in out and "final loss" not in out and "tokens/s" not in out and "ranks seen" not in out
    assert ("  metrics      none: the job made no optimizer step and wrote no metrics.jsonl (steps are counted "
            "at each\n               torch optimizer step or simcluster.step(); log a loss with "
            "simcluster.log(loss=...))\n") in out
    assert "  rank output  2/4 ranks printed (ranks 1, 3 printed nothing)\n" in out
    assert "FAILED" not in out and "no rank printed a Python traceback" not in out


def test_metrics_without_tokens_and_every_rank_printing(stream, capsys):
    rows = [{"step": s, "loss": 1.0 / s, "total_steps": 2} for s in (1, 2)]
    (Path(stream.launch.run_dir) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in range(4):
        stream.handle(f"node-{r // 2}", f"[rank{r}]:ddp rank={r}")
    out = summary_of(stream, {"node-0": 0, "node-1": 0, "rendezvous": 0}, capsys)
    assert "  final loss   0.5 after 2 steps\n" in out and "tokens/s" not in out and "metrics  " not in out
    assert "  rank output  4/4 ranks printed\n" in out and "?" not in out


def test_failed_run_without_any_traceback_says_so(stream, capsys):
    out = summary_of(stream, {"node-0": 1, "node-1": 0, "rendezvous": 0}, capsys)
    assert "  rank output  0/4 ranks printed (none printed anything)" in out
    assert f"  no rank printed a Python traceback or a C++ abort; each rank's output: {stream.launch.run_dir}/cluster.log" \
        in out


def test_a_chained_exception_names_its_root_cause(stream, capsys):
    """`raise ... from ...` and an exception raised while handling another: the summary names the
    chain's first exception (the root cause) as well as the last; an unrelated later traceback of the
    same rank starts a chain of its own."""
    chained = ["Traceback (most recent call last):", '  File "/code/trace.py", line 9, in capture',
               "    out = model(x)", "KeyError: \"Found <class 'DynamicCache'> in output\"", "",
               "The above exception was the direct cause of the following exception:", "",
               *deep_traceback(1, 3, "RuntimeError: It seems that we cannot capture your model as a full graph")]
    handled = ["Traceback (most recent call last):", '  File "/code/a.py", line 1, in f', "ValueError: first", "",
               "During handling of the above exception, another exception occurred:", "",
               "Traceback (most recent call last):", '  File "/code/a.py", line 3, in f', "OSError: second", "",
               "The above exception was the direct cause of the following exception:", "",
               "Traceback (most recent call last):", '  File "/code/a.py", line 5, in g', "TypeError: third"]
    alone = ["Traceback (most recent call last):", '  File "/code/b.py", line 1, in f', "ValueError: earlier",
             "Traceback (most recent call last):", '  File "/code/b.py", line 2, in g', "IndexError: later"]
    feed_interleaved(stream, {1: [f"[rank1]:{x}" if not x.startswith("[rank") else x for x in chained],
                              2: [f"[rank2]:{x}" for x in handled], 3: [f"[rank3]:{x}" for x in alone]})
    text = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 1}, capsys)
    assert "FAILED rank 1 on node-0: RuntimeError: It seems that we cannot capture your model" in text
    assert "root cause: KeyError: \"Found <class 'DynamicCache'> in output\"" in text
    assert "FAILED rank 2 on node-1: TypeError: third" in text and "root cause: ValueError: first" in text
    assert "FAILED rank 3 on node-1: IndexError: later" in text and "ValueError: earlier" not in text
    failed = {f["rank"]: f["lines"] for f in json.loads((Path(stream.launch.run_dir) / "summary.json").read_text())["failed"]}
    assert failed[1][0].startswith("root cause: KeyError") and failed[1][-1].startswith("RuntimeError")


def test_a_node_row_blames_the_node_whose_rank_failed_first(stream, capsys):
    """node-1's rank 2 raised first; node-0's rank 0 only saw its connection close, but node-0 reported
    first, so the verdict (and node-1's own report) named node-0: the rows name node-1 instead."""
    for line in deep_traceback(2, 3, "ValueError: bad batch on rank 2"):
        stream.handle("node-1", line)
    for line in deep_traceback(0, 3, "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"):
        stream.handle("node-0", line)
    stream.handle("rendezvous", "rendezvous: node-0 (ranks 0-1) exited 1")
    stream.handle("rendezvous", "rendezvous: node-1 (ranks 2-3) exited 1 (node-0 (ranks 0-1) failed with exit 1)")
    out = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 1}, capsys)
    assert "  node-0       ranks 0-1      exit 1 (node-1 failed first)\n" in out, out
    assert "  node-1       ranks 2-3      exit 1 (its rank 2 failed first)\n" in out, out
    assert "  FAILED rank 2 on node-1: ValueError: bad batch on rank 2\n" in out and "then failed  rank(s) 0" in out
    assert json.loads((Path(stream.launch.run_dir) / "summary.json").read_text())["first_failed"] == "node-1"


def test_the_first_failure_goes_by_the_time_its_container_wrote_it(stream, capsys):
    """node-0's lines reach the launcher first but were written later (Docker's stamps): node-1's rank 3
    raised first; a rank that timed out waiting for a peer is a consequence, like a closed connection."""
    for line in deep_traceback(0, 2, "torch.distributed.DistBackendError: [gloo] Timed out waiting 60000ms for recv"):
        stream.handle("node-0", line, 1000.5)
    for line in deep_traceback(1, 2, "RuntimeError: bad shard on rank 1"):
        stream.handle("node-0", line, 1000.4)
    for line in deep_traceback(3, 2, "ValueError: bad batch on rank 3"):
        stream.handle("node-1", line, 1000.1)
    stream.handle("rendezvous", "rendezvous: node-0 (ranks 0-1) exited 1")
    out = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 1}, capsys)
    assert "  node-0       ranks 0-1      exit 1 (node-1 failed first)\n" in out, out
    record = json.loads((Path(stream.launch.run_dir) / "summary.json").read_text())
    assert (record["first_failed"], record["first_failed_rank"], record["headline"]) == ("node-1", 3, "FAILED")
    assert record["node_reasons"] == {"node-0": "node-1 failed first", "node-1": "its rank 3 failed first"}


def test_a_compile_failure_gets_its_hint(stream, capsys):
    noexec = ("torch._inductor.exc.InductorError: OSError: /tmp/torchinductor_trainer/ab/c.main.so: failed to map "
              "segment from shared object")
    for line in deep_traceback(0, 2, noexec):
        stream.handle("node-0", line)
    for line in deep_traceback(2, 2, "torch._inductor.exc.InductorError: AssertionError: libcuda.so cannot found!"):
        stream.handle("node-1", line)
    out = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 1}, capsys)
    assert "(torch.compile's inductor loads the code it builds from TORCHINDUCTOR_CACHE_DIR" in out, out
    assert "(triton's NVIDIA driver was asked for a GPU: on the simulated GPUs inductor compiles CPU code" in out, out


# the last lines of tests/tp_compile_check.py --traceback's tp/compiled case (torch 2.13.0, captured on the host)
TP_COMPILE_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/autograd/function.py", line 325, in apply',
    "    return user_fn(self, *args)",
    "           ^^^^^^^^^^^^^^^^^^^^",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/distributed/tensor/_redistribute.py", '
    "line 1954, in backward",
    "    output_dtensor = NestedRedistribute.apply(",
    "                     ^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/autograd/function.py", line 625, in apply',
    "    return super().apply(*args, **kwargs)  # type: ignore[misc]",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/distributed/tensor/_redistribute.py", '
    "line 1994, in forward",
    "    ctx.original_dtype = grad_output._local_tensor.dtype",
    "                         ^^^^^^^^^^^^^^^^^^^^^^^^^",
    "AttributeError: 'Tensor' object has no attribute '_local_tensor'",
]


def test_a_known_torch_bug_is_named_with_its_links_a_gpus_outcome_and_workarounds(stream, capsys):
    """TP under torch.compile's backward error (TORCH_BUGS) on ranks 0 and 1 (its hint said once); the same
    exception line raised from the user's own frame (no DTensor redistribute among the last frames) on rank 2
    is not that bug. summary.json and the API's FailedRank name it too (torch_bug: the entry's name, or None)."""
    from simcluster.launcher.api import Run

    for rank in (0, 1):
        for x in TP_COMPILE_TRACEBACK:
            stream.handle("node-0", f"[rank{rank}]:{x}")
    for x in ["Traceback (most recent call last):", '  File "/work/train.py", line 9, in step',
              "    x._local_tensor", TP_COMPILE_TRACEBACK[-1]]:
        stream.handle("node-1", f"[rank2]:{x}")
    out = summary_of(stream, {"node-0": 1, "node-1": 1, "rendezvous": 1}, capsys)
    rank0, rank1 = out.split("FAILED rank 0", 1)[1].split("FAILED rank 1", 1)
    rank1, rank2 = rank1.split("FAILED rank 2", 1)
    assert "      (the same as rank 0's above)\n" in rank1 and "torch bug" not in rank1, out  # said once
    assert "      (torch bug, not the simulation's: torch 2.13's AOT autograd unwraps an AsyncCollectiveTensor" in rank0
    for words in ("https://github.com/pytorch/pytorch/pull/179849", "https://github.com/pytorch/pytorch/pull/191113",
                  "a GPU run fails the same way", "workarounds: run the TP model uncompiled",
                  "the embedding) gets a zero gradient"):
        assert words in rank0, (words, out)
    assert "torch bug" not in rank2, out
    record = json.loads((Path(stream.launch.run_dir) / "summary.json").read_text())
    assert {f["rank"]: f["torch_bug"] for f in record["failed"]} == {0: "tp-compile-act-grad", 1: "tp-compile-act-grad",
                                                                     2: None}, record["failed"]
    failed = Run(stream.launch.run_dir, stream.launch, 1).failed
    assert [(f.rank, f.torch_bug) for f in failed] == [(0, "tp-compile-act-grad"), (1, "tp-compile-act-grad"), (2, None)]


def test_the_final_loss_is_the_training_loss_in_the_common_formats(stream, capsys):
    """A validation line after the last training line is not the final loss; a framework's dict of
    tensors ('lm loss': tensor(5.12)) and JSON-like dicts are read."""
    codes = {"node-0": 0, "node-1": 0, "rendezvous": 0}

    def printed(*texts: str) -> str:
        if stream.log.closed:  # the summary before closed it
            stream.log = open(stream.log.name, "a", encoding="utf-8", buffering=1)
        for text in texts:
            stream.handle("node-1", f"[rank3]:{text}")
        return summary_of(stream, codes, capsys)

    out = printed("step 1 | train loss 5.500000 | lr 1e-3", "step 2 | train loss 5.250000 | lr 1e-3", "val loss 6.1")
    assert "  final loss   5.25 after 2 steps (as rank 3 printed it)\n" in out, out
    out = printed(" validation loss at iteration 2 | lm loss value: 6.0E+00 |", "step 3: eval loss: 6.2",
                  "validate step: 2  loss: 6.3  memory: 1.2GiB")
    assert "  final loss   5.25 after 2 steps" in out, out
    out = printed("{'lm loss': tensor(5.12), 'grad norm': tensor(0.8)}")
    assert "  final loss   5.12 after 3 steps (as rank 3 printed it)\n" in out, out
    assert "  final loss   4.875 after 4 steps" in printed("{'loss': 4.875, 'grad_norm': 1.5, 'epoch': 0.25}")


def test_a_lost_node_keeps_its_own_reason(stream, capsys):
    for line in deep_traceback(0, 2, "RuntimeError: Connection closed by peer"):
        stream.handle("node-0", line)
    stream.handle("rendezvous", "rendezvous: node-0 (ranks 0-1) exited 1 (node-1 (ranks 2-3) lost: no heartbeat for 25s)")
    out = summary_of(stream, {"node-0": 1, "node-1": 137, "rendezvous": 1}, capsys)
    assert "  node-0       ranks 0-1      exit 1 (node-1 (ranks 2-3) lost: no heartbeat for 25s)\n" in out, out


def test_a_loss_only_printed_is_the_final_loss(stream, capsys):
    for step, loss in ((1, 2.5), (2, 2.25)):  # torchtitan's format, colours and all, on every rank
        for r in range(4):
            stream.handle(f"node-{r // 2}", f"[rank{r}]:\x1b[31mstep: {step:2}  \x1b[32mloss: {loss:7.4f}  \x1b[39m")
    out = summary_of(stream, {"node-0": 0, "node-1": 0, "rendezvous": 0}, capsys)
    assert out.startswith(" OK ==") and "  final loss   2.25 after 2 steps (as rank 3 printed it)\n" in out, out
    assert json.loads((Path(stream.launch.run_dir) / "summary.json").read_text())["final_loss"] == 2.25
    stream.metric_regex = r"^step: +(?P<step>\d+) +loss: +(?P<value>\S+)"  # the colours are taken off first
    assert "  final loss   2.25 after 2 steps (as rank 3 printed it)\n" in summary_of(
        stream, {"node-0": 0, "node-1": 0, "rendezvous": 0}, capsys)


def test_exit_0_without_a_step_or_a_collective_is_no_work(stream, capsys):
    run = Path(stream.launch.run_dir)
    (run / "steps").mkdir()
    for r in range(4):
        stream.handle(f"node-{r // 2}", f"[rank{r}]:Unable to locate sufficient 4 gpus to run this example. Exiting.")
        (run / "steps" / f"rank-{r}.work.json").write_text(json.dumps({"collectives": 0}) + "\n")
    codes = {"node-0": 0, "node-1": 0, "rendezvous": 0}
    out = summary_of(stream, codes, capsys)
    assert out.startswith(" NO WORK ==\n  NO WORK      every rank exited 0 without a step or a collective"), out
    assert json.loads((run / "summary.json").read_text())["no_work"] is True
    (run / "steps" / "rank-3.work.json").write_text(json.dumps({"collectives": 2}) + "\n")  # one all_reduce: work
    assert summary_of(stream, codes, capsys).startswith(" OK ==")
    (run / "steps" / "rank-3.work.json").unlink()  # a rank without its record: nothing is claimed
    assert summary_of(stream, codes, capsys).startswith(" OK ==")


def test_quiet_keeps_rank_0s_step_lines_in_the_log_for_the_printed_loss(stream, capsys):
    assert stream.quiet
    for step, loss in ((1, 0.856526), (2, 0.865871)):
        stream.handle("node-0", f"[rank0]:step {step}/2 loss {loss:.6f}")
    assert "step 2/2 loss" not in capsys.readouterr().out  # hidden, as --quiet does
    out = summary_of(stream, {"node-0": 0, "node-1": 0, "rendezvous": 0}, capsys)
    assert "  final loss   0.865871 after 2 steps (as rank 0 printed it)\n" in out, out
    assert "node-0 r0 | step 2/2 loss 0.865871" in " ".join(Path(stream.log.name).read_text().split())


def test_a_bad_metric_regex_is_refused_before_anything_starts(tmp_path, capsys):
    from simcluster.launcher import cli

    run = tmp_path / "run"
    assert cli.main(["up", "--script", str(ROOT / "examples" / "ddp.py"), "--nodes", "1", "--nproc-per-node", "1",
                     "--run-dir", str(run), "--metric-regex", "(a)(b)"]) == 2
    assert "metric_regex: '(a)(b)' has 2 group(s)" in capsys.readouterr().err and not run.exists()
