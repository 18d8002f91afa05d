"""Launcher runtime pieces without Docker: log parsing, the node wrapper, the rendezvous store.

    python -m pytest -q tests/test_launcher_runtime.py

The store tests need torch on the host (skipped without); they run launcher.container.rendezvous
and launcher.container.node as local processes on 127.0.0.1, the same code the containers run.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import need_torch, noise, noise_context

from simcluster.launcher.container.node import torchrun_command
from simcluster.launcher.container.workdir import check_writable
from simcluster.launcher.container.rendezvous import summary
from simcluster.launcher.observe.progress import Progress, format_duration, parse_done, parse_step, split_rank
from simcluster.launcher.docker.handle import sanitize_project

ROOT = Path(__file__).resolve().parent.parent
STEP = "step 12/300 loss 3.2145 grad_norm 1.2300 lr 3.00e-03 step_time 0.512s tokens_per_s 4000 rss_mb 312"


def test_parse_trainer_lines():
    assert split_rank("[rank5]:" + STEP) == (5, STEP)
    assert split_rank("plain") == (None, "plain")
    s = parse_step(STEP)
    assert s["step"] == 12 and s["total"] == 300 and s["loss"] == pytest.approx(3.2145)
    assert s["step_time"] == pytest.approx(0.512) and s["tokens_per_s"] == 4000 and s["lr"] == pytest.approx(3e-3)
    assert parse_step("stepping 1/2") is None
    d = parse_done("done steps=300 final_loss=1.8123 tokens_per_s=4100 wall_s=250.1 run_dir=/runs/x")
    assert d == {"steps": "300", "final_loss": "1.8123", "tokens_per_s": "4100", "wall_s": "250.1", "run_dir": "/runs/x"}


def test_progress_eta():
    p = Progress()
    p.update(parse_step("step 1/11 loss 5.0 step_time 2.0s tokens_per_s 100"), now=100.0)
    assert p.eta_s() == pytest.approx(20.0)  # from step_time before a rate is known
    p.update(parse_step("step 6/11 loss 4.0 step_time 2.0s tokens_per_s 100"), now=105.0)
    assert p.eta_s() == pytest.approx(5.0)  # 1 s per step observed
    assert p.line() == "progress: step 6/11 (55%) loss 4.0000 tokens/s 100 ETA 5s"
    assert format_duration(3725) == "1h02m" and format_duration(247) == "4m07s" and format_duration(None) == "?"


def test_node_wrapper_helpers(tmp_path):
    assert check_writable(str(tmp_path / "new")) is None and (tmp_path / "new").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    msg = check_writable(str(blocker / "sub"))
    assert "not writable" in msg and f"chown {os.getuid()}:{os.getgid()}" in msg and "python -m launcher up" in msg
    args = argparse.Namespace(nnodes=2, node_rank=1, nproc_per_node=4, rdzv_backend="c10d",
                              rdzv_endpoint="rendezvous:29400", run_id="r", module="train", script=None,
                              join_timeout_s=300.0)
    cmd = torchrun_command(args, "node-1", ["--mesh", "2x2x2"])
    for part in ("--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=rendezvous:29400", "--rdzv-conf=is_host=false,heartbeat_timeout=60,join_timeout=360", "--rdzv-id=r",
                 "--local-addr=node-1", "--tee=3"):
        assert part in cmd
    assert cmd[-4:] == ["-m", "train", "--mesh", "2x2x2"]
    assert cmd[:3] == [sys.executable, "-m", "simcluster.train.forkrun"]  # ranks forked after one import per node
    assert not any(p.startswith("--node-rank") for p in cmd)  # c10d orders the nodes; torch would warn it ignores it
    args.rdzv_backend = "static"
    static = torchrun_command(args, "node-1", [])
    assert "--master-addr=rendezvous" in static and "--node-rank=1" in static
    args.torchrun = True
    assert Path(torchrun_command(args, "node-1", [])[0]).name in ("torchrun", Path(sys.executable).name)
    args.script = "/code/train.py"  # the user's script: torchrun runs the file, with its own arguments
    assert torchrun_command(args, "node-1", ["--lr", "1"])[-4:] == ["--tee=3", "/code/train.py", "--lr", "1"]


def _launch(launcher: list[str], run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*launcher, "--standalone", "--nproc-per-node=2", "--tee=3", "-m", "train", "--mesh", "1x1x2",
                           "--model", "tiny", "--steps", "3", "--run-dir", str(run_dir), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_forkrun_trains_like_torchrun(tmp_path):
    """simcluster.train.forkrun (torchrun's agent, ranks forked after one import) gives the same run
    as stock torchrun, with torchrun's log prefixes and exit status."""
    need_torch()
    fork = _launch([sys.executable, "-m", "simcluster.train.forkrun"], tmp_path / "fork")
    stock = _launch([sys.executable, "-m", "torch.distributed.run"], tmp_path / "stock")
    assert fork.returncode == 0 and stock.returncode == 0, fork.stderr[-2000:] + stock.stderr[-2000:]
    losses = [[json.loads(line)["loss"] for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
              for d in ("fork", "stock")]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    assert "[default1]:[simcluster] rank=1 local_rank=1 world_size=2" in fork.stdout
    bad = _launch([sys.executable, "-m", "simcluster.train.forkrun"], tmp_path / "bad", "--n-heads", "3")
    assert bad.returncode == 1 and "n_heads" in bad.stdout + bad.stderr  # rank exits 2, the agent 1, as torchrun


FORK_PARENT = """
import os
if __name__ == "__main__":  # forkrun imports this module in the agent first: nothing runs there
    import torch.distributed as dist
    from simcluster.launcher.container.ranks import rank_processes

    dist.init_process_group("gloo")
    dist.barrier()  # every rank forked before the tree is read
    server = os.getppid()
    with open(f"/proc/{server}/status") as fh:
        threads = next(line.split()[1] for line in fh if line.startswith("Threads:"))
    with open(f"/proc/{server}/stat") as fh:
        agent = int(fh.read().rsplit(")", 1)[1].split()[1])
    found = {rank: pid for rank, (pid, _) in rank_processes(agent, 0).items()}
    print(f"rank={dist.get_rank()} parent_threads={threads} found={found.get(dist.get_rank()) == os.getpid()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
"""


def test_forkrun_forks_its_ranks_from_a_one_thread_server(tmp_path):
    """The ranks are forked by a process with one thread (forkrun's fork server), not by torchrun's
    agent, whose store and keep-alive threads may hold a lock at the fork that the rank then waits
    on forever (1 rank in a few dozen 2x2x2 runs hung before its process group); and
    launcher.container.ranks still names each rank's process (the freeze drills use it)."""
    need_torch()
    (tmp_path / "fork_parent.py").write_text(FORK_PARENT)
    proc = subprocess.run([sys.executable, "-m", "simcluster.train.forkrun", "--standalone",
                           "--nproc-per-node=3", "--tee=3", "-m", "fork_parent"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{tmp_path}"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for rank in range(3):
        assert f"rank={rank} parent_threads=1 found=True" in proc.stdout, proc.stdout[-2000:]


USER_SCRIPT = """
import os, sys
import torch
import torch.distributed as dist
from simcluster.launcher.instrument import rank as instruments

dist.init_process_group("gloo")
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(2):
    (w * w).sum().backward()
    opt.step()
print(f"rank={dist.get_rank()} name={__name__} argv={sys.argv} path0={sys.path[0]} "
      f"clock={instruments.CLOCK is not None} main={sys.modules['__main__'].__file__ == __file__}", flush=True)
dist.destroy_process_group()
"""


def test_forkrun_starts_a_script_as_a_fresh_interpreter_does(tmp_path):
    """The user's script, forked by forkrun, sees what stock torchrun's fresh interpreter gives
    it (__name__, sys.argv, the script's folder first on sys.path, __main__) and its instruments
    installed before it runs (the step clock writes steps/rank-R.jsonl)."""
    need_torch()
    code = tmp_path / "code"
    code.mkdir()
    (code / "user_train.py").write_text(USER_SCRIPT)
    from simcluster.launcher.container.node import instrument_env

    out = {}
    for name, launcher in (("fork", "simcluster.train.forkrun"), ("stock", "torch.distributed.run")):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
               "SIMCLUSTER_OUTPUT_DIR": str(tmp_path / name)}
        instrument_env(env)
        proc = subprocess.run([sys.executable, "-m", launcher, "--standalone", "--nproc-per-node=2", "--tee=3",
                               "user_train.py", "--lr", "1"], cwd=code, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert not noise(proc.stdout + proc.stderr), proc.stderr[-2000:]
        out[name] = sorted(line.split(":", 1)[1] for line in proc.stdout.splitlines() if "rank=" in line)
        for r in range(2):
            steps = (tmp_path / name / "steps" / f"rank-{r}.jsonl").read_text().splitlines()
            assert [json.loads(line)["step"] for line in steps] == [1, 2]
    assert out["fork"] == out["stock"] and len(out["fork"]) == 2, out
    assert f"argv=['user_train.py', '--lr', '1'] path0={code} clock=True main=True" in out["fork"][0]


SPAWN = """
import os, sys, time
from simcluster.train import forkrun
argv = sys.argv[2:]
agent = forkrun.spawn(argv, {**os.environ, "SPAWNED": "1"}, None)
if sys.argv[1] == "cancel":
    agent.cancel()
else:
    agent.start()
    while agent.poll() is None:
        time.sleep(0.05)
print("agent exit", agent.returncode, flush=True)
"""


def test_the_node_forks_its_agent_behind_a_gate(tmp_path):
    """forkrun.spawn, as the node wrapper uses it: the agent forked from a process that imported
    the module once; it waits for start() (cancel(): exits 2 without starting) and ends with
    torchrun's status: 0 for a good run, 1 (with the message) for a command forkrun refuses.
    Run in a fresh interpreter: the pytest worker has threads, which a fork must not hold."""
    need_torch()

    def spawn(mode, *argv):
        return subprocess.run([sys.executable, "-c", SPAWN, mode, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})

    good = spawn("start", "--standalone", "--nproc-per-node=2", "--tee=3", "-m", "train", "--mesh", "1x1x2", "--model",
                 "tiny", "--steps", "1", "--val-every", "0", "--run-dir", str(tmp_path / "good"))
    assert "agent exit 0" in good.stdout, good.stdout[-2000:] + good.stderr[-2000:]
    assert "[default1]:[simcluster] rank=1 local_rank=1 world_size=2" in good.stdout
    assert (tmp_path / "good" / "metrics.jsonl").exists()
    assert not noise(good.stdout + good.stderr), good.stderr[-2000:]
    refused = spawn("start", "--standalone", "--nproc-per-node=1", "--no-python", "echo")
    assert "agent exit 1" in refused.stdout and "--no-python and --run-path are not supported" in refused.stderr
    cancelled = spawn("cancel", "--standalone", "--nproc-per-node=1", "-m", "train", "--run-dir", str(tmp_path / "c"))
    assert "agent exit 2" in cancelled.stdout and not (tmp_path / "c").exists()


def test_summary_and_targets():
    ok = {"node-1": {"ranks": "4-7", "exit_code": 0}, "node-0": {"ranks": "0-3", "exit_code": 0}}
    lines, status = summary(ok, 2)
    assert status == 0 and lines[0].split()[:5] == ["node-0", "ranks", "0-3", "exit", "0"]
    assert summary({**ok, "node-1": {"ranks": "4-7", "exit_code": 1}}, 2)[1] == 1
    lines, status = summary({"node-0": ok["node-0"]}, 2)
    assert status == 1 and "never reported" in lines[-1]
    assert sanitize_project("sc-2x2x2-20250101T000000Z") == "sc-2x2x2-20250101t000000z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rendezvous(port: int, nnodes: int, grace: float = 30) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "simcluster.launcher.container.rendezvous", "--port", str(port), "--nnodes", str(nnodes),
                             "--lost-after-s", "24",
                             "--grace-s", str(grace), "--timeout-s", "120"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_rendezvous_collects_exit_codes():
    need_torch()
    from simcluster.launcher.container.heartbeat import report

    port = _free_port()
    server = _rendezvous(port, 2)
    report(f"127.0.0.1:{port}", "node-1", 1, 2, 0)
    report(f"127.0.0.1:{port}", "node-0", 0, 2, 0)
    out, _ = server.communicate(timeout=60)
    assert server.returncode == 0, out
    assert "node-0     ranks 0-1" in out and "all nodes exited 0" in out

    port = _free_port()
    server = _rendezvous(port, 3, grace=1)
    t0 = time.monotonic()
    report(f"127.0.0.1:{port}", "node-2", 2, 1, 1)
    out, _ = server.communicate(timeout=60)
    assert server.returncode == 1 and "2 node(s) never reported" in out and "FAILED" in out
    assert time.monotonic() - t0 < 30


def _node(port: int, k: int, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "simcluster.launcher.container.node", "--nnodes", "2", "--node-rank", str(k),
                             "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "t",
                             "--module", "simcluster.launcher.container.probe", "--node-name", f"127.0.0.{k + 1}",
                             "--run-dir", str(run_dir), "--lost-after-s", "24"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_node_wrapper_ranks_follow_node_names_not_arrival(tmp_path):
    """Two nodes x two ranks via c10d against the separate store, as in the containers; the
    second node (127.0.0.2) joins first, yet the first (127.0.0.1) gets ranks 0-1."""
    need_torch()
    port = _free_port()
    server = _rendezvous(port, 2)
    late = _node(port, 1, tmp_path)
    time.sleep(3)
    early = _node(port, 0, tmp_path)
    outs = [p.communicate(timeout=300)[0] for p in (early, late)]
    out, _ = server.communicate(timeout=60)
    assert early.returncode == 0 and late.returncode == 0, outs[0][-3000:] + outs[1][-3000:] + out[-2000:]
    for k, text in enumerate(outs):
        for local in (0, 1):
            r = 2 * k + local
            assert f"[rank{r}]:probe rank={r} local_rank={local} world_size=4" in text
            assert f"[rank{r}]:probe rank={r} all_reduce=6 expected=6 ok" in text
    assert server.returncode == 0 and "all nodes exited 0" in out
    for text in (*outs, out):  # the quiet end: no store call fails after the rendezvous closed
        assert not noise(text), noise_context(text)


def test_code_digest_follows_content_not_mtimes(tmp_path):
    """The trainer image's staleness check: the digest changes with a file's bytes or name,
    not with its modification time (a cached image build keeps its old creation time)."""
    from simcluster.launcher.job.files import code_digest

    (tmp_path / "train").mkdir()
    (tmp_path / "launcher").mkdir()
    (tmp_path / "train" / "a.py").write_text("x = 1\n")
    (tmp_path / "launcher" / "b.py").write_text("y = 2\n")
    (tmp_path / "train" / "notes.txt").write_text("not code\n")
    sources = {"simcluster/train": str(tmp_path / "train"), "simcluster/launcher": str(tmp_path / "launcher")}
    first = code_digest(sources)
    os.utime(tmp_path / "train" / "a.py", (1, 1))
    (tmp_path / "train" / "notes.txt").write_text("changed, still not code\n")
    assert code_digest(sources) == first
    (tmp_path / "train" / "a.py").write_text("x = 2\n")
    second = code_digest(sources)
    assert second != first
    (tmp_path / "train" / "a.py").rename(tmp_path / "train" / "c.py")
    assert code_digest(sources) not in (first, second)
    assert len(code_digest()) == 64  # this checkout


def test_run_folders_of_one_name_are_two_projects(tmp_path):
    """a/run and b/run get their own compose projects (one `up` never touches the other's)."""
    from simcluster.launcher.docker.handle import Handle

    a, b = Handle.for_run(str(tmp_path / "a" / "run")), Handle.for_run(str(tmp_path / "b" / "run"))
    assert a.project != b.project and a.project.startswith("sc-run-") and b.project.startswith("sc-run-")
    assert Handle.for_run(str(tmp_path / "a" / "run")).project == a.project
    assert a.file == str(tmp_path / "a" / "run" / "compose.yml")


def test_failing_ranks_are_named_with_traceback_or_cxx_abort(tmp_path, capsys):
    """The summary's failure lines: a Python traceback's last frames and exception, a C++ abort's
    ``terminate called`` line (with the teardown-race hint), and peers that only saw one die."""
    from simcluster.launcher.job.entry import resolve_code
    from simcluster.launcher.job.launch import NodeOptions
    from simcluster.launcher.observe.follow import Stream
    from simcluster.launcher.observe.summary import _show_failures

    script = tmp_path / "job.py"
    script.write_text("print('hi')\n")
    launch = resolve_code(NodeOptions(user="0:0"), script=str(script), nodes=2, nproc_per_node=2,
                          run_dir=str(tmp_path / "run"))
    stream = Stream(launch, str(tmp_path / "log"), quiet=True, progress_every=10)
    lines = [("node-0", "[rank1]:Traceback (most recent call last):"), ("node-0", '[rank1]:  File "job.py", line 3'),
             ("node-0", "[rank1]:ValueError: boom on rank 1"),
             ("node-1", "[rank3]:step 4/4 loss 0.5"), ("node-1", "[rank3]:terminate called without an active exception"),
             ("node-1", "[rank2]:Traceback (most recent call last):"),
             ("node-1", "[rank2]:RuntimeError: Connection closed by peer [10.0.0.2]:1234")]
    for service, line in lines:
        stream.handle(service, line)
    shown: list[str] = []
    _show_failures(shown.append, launch, stream.tracebacks())
    text = "\n".join(shown)
    assert shown[0] == "  FAILED rank 1 on node-0: ValueError: boom on rank 1", text
    assert "FAILED rank 3 on node-1: terminate called without an active exception" in text
    assert "gloo's teardown race" in text and "gc.collect()" in text
    assert text.endswith("then failed  rank(s) 2: a peer's connection closed")
    stream.log.close()


def test_metrics_tail_skips_a_previous_runs_file(tmp_path):
    """A reused run folder: the old metrics.jsonl gives no progress rows until this run writes it."""
    from simcluster.core.rundir import MetricsTail

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    os.utime(path, (1000.0, 1000.0))
    tail = MetricsTail(str(tmp_path), since=2000.0)  # the run folder, not the file
    assert tail.rows() == []
    path.write_text('{"step": 1, "loss": 5.0}\n{"step": 2')  # this run's job rewrites it; a cut-short line waits
    assert tail.rows() == [{"step": 1, "loss": 5.0}]
    with open(path, "a") as fh:
        fh.write(', "loss": 4.0}\n')
    assert tail.rows() == [{"step": 2, "loss": 4.0}]
    assert MetricsTail(str(tmp_path)).rows() == [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0}]


def test_flight_recorder_entries_shrink_past_64_ranks_and_a_users_setting_wins(monkeypatch):
    """An entry holds its call's Python stack (2000 grew a rank by 3.3 MB: 1.7 GB at 512 ranks): torch's
    2000 up to 64 ranks, 250 at 512; TORCH_FR_BUFFER_SIZE in the node's environment wins."""
    from simcluster.launcher.container.node import node_parser, ranks_env

    def env_of(nnodes: int, per: int) -> str:
        args = node_parser().parse_args(["--nnodes", str(nnodes), "--node-rank", "0", "--nproc-per-node", str(per),
                                         "--lost-after-s", "60"])
        return ranks_env(args, "node-0")["TORCH_FR_BUFFER_SIZE"]

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    assert (env_of(2, 4), env_of(8, 8), env_of(8, 16), env_of(16, 32)) == ("2000", "2000", "1000", "250")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "4000")
    assert env_of(16, 32) == "4000"
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "3000")  # the older name: torch reads TORCH_FR_BUFFER_SIZE first
    args = node_parser().parse_args(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                                     "--lost-after-s", "60"])
    assert "TORCH_FR_BUFFER_SIZE" not in ranks_env(args, "node-0")  # so none is set beside it: the user's 3000 counts
