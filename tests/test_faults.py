"""Fault drills on real containers: a node killed, frozen or cut off mid-run is named and the run
ends; ``up --max-restarts`` recovers from the last checkpoint; a late node joins in time, and one
past the join timeout is named.

    python -m pytest -q tests/test_faults.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_faults.py    # fails instead

Each test runs ``python -m launcher up --mount-code`` (the containers run this checkout's train/
and launcher/ over the image's copy, so no rebuild is needed after a change) on a 2x1x1 tiny
mesh with ``--timeout-s 20`` (a node silent for 8 s is lost), and ``python -m launcher chaos``
for the faults, as a user would. Needs the image simcluster/trainer:latest (bash images/build.sh)
and torch on the host for the two tests without Docker. About 6-8 minutes
on a quiet 2-core machine.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import need_torch, reference_losses
from simcluster.launcher.docker.handle import Handle

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
TIMEOUT_S = 20  # the trainer's --timeout-s in these tests: detection must come within it
UP_LIMIT_S = 600


def docker_test(fn):
    """Needs Docker and the trainer image (skips without them, fails under CI=true)."""
    return pytest.mark.docker(pytest.mark.usefixtures("trainer_image")(fn))


def project_states(project: str) -> dict[str, str]:
    """service -> state (running, paused, exited, ...) of a compose project's containers."""
    out = subprocess.run(["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={project}",
                          "--format", '{{.Label "com.docker.compose.service"}} {{.State}}'],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rendezvous_names_silent_and_missing_nodes():
    """No Docker: node 0 heartbeats, then goes silent (lost after 2 s); node 1 never joins (15 s: node 0's
    first beat must land inside that window on a machine at full load too; a grace of 15 s after the
    first verdict keeps the store open for the second)."""
    need_torch()
    from simcluster.launcher.container.heartbeat import Heartbeat

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "simcluster.launcher.container.rendezvous", "--port", str(port), "--nnodes", "2",
                               "--lost-after-s", "2", "--join-timeout-s", "15", "--grace-s", "15"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    hb = Heartbeat(f"127.0.0.1:{port}", "node-0", 0, 2, interval=0.2)
    hb.start()
    t0 = time.monotonic()
    while not hb.ever_ok and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    assert hb.ever_ok, "heartbeat never reached the rendezvous"
    time.sleep(1.0)
    hb.halt.set()  # silent from now on
    out, _ = server.communicate(timeout=60)
    assert server.returncode == 1, out
    assert "LOST node-0 (ranks 0-1): no heartbeat for" in out, out
    assert "LOST node-1 (ranks 2-3): never joined within the 15s join timeout" in out, out
    assert "rendezvous: FAILED: node-" in out


def test_start_late_option_and_restart_launch(tmp_path):
    from simcluster.launcher.api import parse_start_late
    from simcluster.launcher.job.entry import resolve_training
    from simcluster.launcher.job.launch import NodeOptions
    from simcluster.launcher.job.launch import restart_launch
    from simcluster.core.config import Config
    from simcluster.core.errors import ConfigError

    assert parse_start_late(["node-1=20", "node-2=0.5"]) == {"node-1": 20.0, "node-2": 0.5}
    for bad in (["node-1"], ["=3"], ["node-1=-1"], ["node-1=x"]):
        with pytest.raises(ConfigError):
            parse_start_late(bad)
    launch = resolve_training(Config(mesh="2x1x1", run_dir=str(tmp_path / "run")), NodeOptions())
    again = restart_launch(launch, 2)
    assert again.argv == (*launch.argv, "--resume", "auto") and again.restart == 2


class Up:
    """``launcher up`` in the background in its own run folder; fault it with ``chaos``."""

    def __init__(self, tmp: Path, *flags: str, mesh: str = "2x1x1"):
        self.run_dir = tmp / f"ft-{uuid.uuid4().hex[:8]}"
        self.project = Handle.for_run(str(self.run_dir)).project
        self.out = tmp / f"{self.run_dir.name}.out"
        self.cmd = [sys.executable, "-m", "launcher", "up", "--mesh", mesh, "--model", "tiny", "--mount-code",
                    "--timeout-s", str(TIMEOUT_S), "--run-dir", str(self.run_dir), *flags]
        self.fh = open(self.out, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.fh, stderr=subprocess.STDOUT, text=True)
        self.t_exit: float | None = None
        self.t_all_stopped: float | None = None

    def chaos(self, *args: str) -> tuple[subprocess.CompletedProcess, float]:
        """Run ``launcher chaos ARGS --run-dir RUN``; returns it and the UNIX time of the fault."""
        proc = subprocess.run([sys.executable, "-m", "launcher", "chaos", *args, "--run-dir", str(self.run_dir),
                               "--wait-s", "400"], cwd=ROOT, capture_output=True, text=True, timeout=450)
        m = re.search(r" t=(\d+\.\d+)", proc.stdout)
        return proc, float(m.group(1)) if m else time.time()

    def wait(self) -> int:
        """Wait for ``up`` to exit, noting when no container of the run was running or paused any more."""
        t0 = time.monotonic()
        try:
            while self.proc.poll() is None and time.monotonic() - t0 < UP_LIMIT_S:
                if self.t_all_stopped is None and not {"running", "paused", "restarting"} & set(
                        project_states(self.project).values()):
                    self.t_all_stopped = time.time()
                time.sleep(0.25)
            if self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.fh.close()
        self.t_exit = time.time()
        if self.t_all_stopped is None:
            self.t_all_stopped = self.t_exit
        return self.proc.returncode

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def why(self) -> str:
        return f"`{' '.join(self.cmd)}` exited {self.proc.returncode}:\n{self.output()[-6000:]}"

    def metrics(self) -> list[dict]:
        with open(self.run_dir / "metrics.jsonl", encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for cid in subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"],
                                  capture_output=True, text=True).stdout.split():
            subprocess.run(["docker", "unpause", cid], capture_output=True)
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
        subprocess.run(["docker", "network", "rm", f"{self.project}_cluster"], capture_output=True)


@docker_test
def test_frozen_rank_is_named_and_every_container_stops(tmp_path):
    """One rank SIGSTOPped inside node-1 (its node's heartbeat goes on): node-1 names the frozen
    rank within 0.4 x --timeout-s, the summary says so, everything stops within the timeout plus
    a margin, and up exits 1."""
    up = Up(tmp_path, "--steps", "2000")
    try:
        chaos, t_fault = up.chaos("--freeze", "1", "--at-step", "3")
        assert chaos.returncode == 0 and "sent SIGSTOP" in chaos.stdout, chaos.stdout + chaos.stderr + up.why()
        code = up.wait()
        out = up.output()
        stopped_s, exit_s = up.t_all_stopped - t_fault, up.t_exit - t_fault
        print(f"\nfrozen rank: all containers stopped after {stopped_s:.1f}s, up exited after {exit_s:.1f}s")
        assert code == 1, up.why()
        assert re.search(r"node-1 +ranks 1 +exit 137 \(rank 1 on node-1 frozen: its process is stopped \(SIGSTOP\) "
                         r"for \d+s \(limit 8s\)\)", out), up.why()
        assert stopped_s < TIMEOUT_S + 15 and exit_s < TIMEOUT_S + 30, (stopped_s, exit_s, up.why())
        assert project_states(up.project) == {}
    finally:
        up.cleanup()


@docker_test
def test_docker_stop_is_reported_as_stopped_by_a_signal(tmp_path):
    up = Up(tmp_path, "--steps", "2000")
    try:
        chaos, _ = up.chaos("--stop", "node-1", "--at-step", "3")
        assert chaos.returncode == 0, chaos.stdout + chaos.stderr + up.why()
        assert up.wait() == 1, up.why()
        assert re.search(r"node-1 +ranks 1 +exit 143 \(stopped by SIGTERM\)", up.output()), up.why()
        assert project_states(up.project) == {}
    finally:
        up.cleanup()


@docker_test
def test_ctrl_c_ends_everything_within_20_s(tmp_path):
    """Ctrl-C: `up` stops every container and exits 130. Quiet, it takes a few seconds; the bound is 20 s
    because on a busy machine (the suite beside a 2x2x2 job, load about 20) it took 14.8 s."""
    up = Up(tmp_path, "--steps", "2000")
    try:
        t0 = time.monotonic()
        while not (up.run_dir / "metrics.jsonl").is_file() and time.monotonic() - t0 < 300:
            time.sleep(0.5)
        assert (up.run_dir / "metrics.jsonl").is_file(), up.why()
        t_int = time.time()
        up.proc.send_signal(signal.SIGINT)
        code = up.wait()
        print(f"\nCtrl-C: up exited after {up.t_exit - t_int:.1f}s, containers stopped after "
              f"{up.t_all_stopped - t_int:.1f}s")
        assert code == 130, up.why()
        assert up.t_exit - t_int < 20 and project_states(up.project) == {}, (up.t_exit - t_int, up.why())
    finally:
        up.cleanup()


@docker_test
def test_a_closed_stdout_leaves_no_cluster_and_no_traceback(tmp_path):
    """`launcher up ... | head -3`: the reader goes, up's next line meets a broken pipe; it removes its
    cluster and exits 1 without a traceback (a new user found the containers left behind)."""
    run_dir = tmp_path / "piped"
    project = Handle.for_run(str(run_dir)).project
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "up", "--mesh", "1x1x1", "--model", "tiny", "--mount-code",
                             "--steps", "2000", "--run-dir", str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # as `head -3` reads
            proc.stdout.readline()
        proc.stdout.close()
        code = proc.wait(timeout=120)
        err = proc.stderr.read()
        assert code == 1 and "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
        assert project_states(project) == {}, project_states(project)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run([sys.executable, "-m", "launcher", "down", "--run-dir", str(run_dir)], cwd=ROOT,
                       capture_output=True, timeout=120)


@docker_test
@pytest.mark.parametrize("fault", ["kill", "pause", "disconnect"])
def test_lost_node_is_named_within_the_timeout(tmp_path, fault):
    """node-1 faulted at step 3: within --timeout-s the rendezvous names it (node-1, rank 1),
    node-0 stops with that error, no container is left, and ``up`` exits 1 with it in the summary."""
    up = Up(tmp_path, "--steps", "2000")
    try:
        chaos, t_fault = up.chaos(f"--{fault}", "node-1", "--at-step", "3")
        assert chaos.returncode == 0, chaos.stdout + chaos.stderr + up.why()
        assert f"chaos: {fault} node-1" in chaos.stdout
        code = up.wait()
        out = up.output()
        assert code == 1, up.why()
        named = re.search(r"LOST +node-1 \(ranks 1\): .*t=(\d+\.\d+)\)", out)
        assert named, up.why()
        detect_s, stopped_s, exit_s = float(named.group(1)) - t_fault, up.t_all_stopped - t_fault, up.t_exit - t_fault
        print(f"\n{fault}: named after {detect_s:.1f}s, all containers stopped after {stopped_s:.1f}s, "
              f"up exited after {exit_s:.1f}s")
        assert detect_s < TIMEOUT_S and stopped_s < TIMEOUT_S, (detect_s, stopped_s, up.why())
        assert exit_s < TIMEOUT_S + 30, (exit_s, up.why())
        assert re.search(r"node-0 +\| \[node-0\] error: node-1 \(ranks 1\) lost: no heartbeat", out), up.why()
        assert "rendezvous: FAILED: node-1 (ranks 1) lost" in out and "== summary: FAILED ==" in out
        assert project_states(up.project) == {}, "up left containers behind: " + str(project_states(up.project))
    finally:
        up.cleanup()


@docker_test
def test_max_restarts_resumes_and_matches_an_uninterrupted_run(tmp_path):
    """node-1 killed at step 10 of 20 (checkpoints every 5): ``up --max-restarts 1`` restarts the
    cluster, resumes from the newest checkpoint and finishes; every step once in metrics.jsonl and
    each step's loss equals an uninterrupted run's within 1e-4 relative: the one-process reference
    (train/reference.py, which the parity tests tie to every mesh), trained here."""
    assert DATA.is_file(), f"corpus missing: {DATA}"
    job = ("--steps", "20", "--data", str(DATA))
    up = Up(tmp_path, *job, "--ckpt-every", "5", "--max-restarts", "1")
    try:
        chaos, t_fault = up.chaos("--kill", "node-1", "--at-step", "10")
        assert chaos.returncode == 0, chaos.stdout + chaos.stderr + up.why()
        code = up.wait()
        out = up.output()
        assert code == 0, up.why()
        assert "launcher: restart 1/1" in out and "resumes with --resume auto" in out, up.why()
        resumed = re.search(r"\[simcluster\] resumed from \S+step-(\d+) at step (\d+)", out)
        assert resumed and int(resumed.group(2)) >= 5, up.why()
        restart = re.search(r"launcher: restart 1/1 after (\d+\.\d)s", out)
        print(f"\nrecovery: killed at t={t_fault:.1f}, restart began {restart.group(1)}s after up started, resumed "
              f"from step {resumed.group(2)}, up finished {up.t_exit - t_fault:.1f}s after the fault")
        rows = up.metrics()
        assert [r["step"] for r in rows] == list(range(1, 21)), [r["step"] for r in rows]
        assert project_states(up.project) == {}
    finally:
        up.cleanup()
    ref = reference_losses("2x1x1", 20, DATA)
    bad = [(r["step"], r["loss"], want) for r, want in zip(rows, ref) if abs(r["loss"] - want) > 1e-4 * abs(want)]
    assert not bad, f"steps (step, resumed run's loss, reference loss) off by > 1e-4 relative: {bad}"


@docker_test
def test_late_node_joins_within_the_join_timeout(tmp_path):
    """node-1 starts 15 s after the others (join timeout 180 s: a node's start took 50 s beside three other
    clusters on this 2-core machine; the test ends once it joins, so the margin costs nothing): it joins
    and the run succeeds."""
    up = Up(tmp_path, "--steps", "3", "--start-late", "node-1=15", "--join-timeout-s", "180")
    try:
        code = up.wait()
        out = up.output()
        assert code == 0, up.why()
        assert "starting node-1" in out and "late (--start-late)" in out and "== summary: OK ==" in out, up.why()
        assert [r["step"] for r in up.metrics()] == [1, 2, 3]
    finally:
        up.cleanup()


@docker_test
def test_node_past_the_join_timeout_is_named(tmp_path):
    """node-1 due 120 s late with a 45 s join timeout: the job ends non-zero naming node-1. The timeout
    is what a healthy node needs to join on a busy machine: node-0's import of torch took past 15 s
    with three clusters of the suite's workers starting at once, and the rendezvous named it too."""
    up = Up(tmp_path, "--steps", "3", "--start-late", "node-1=120", "--join-timeout-s", "45")
    try:
        t0 = time.time()
        code = up.wait()
        out = up.output()
        assert code == 1, up.why()
        assert re.search(r"LOST +node-1 \(ranks 1\): never joined within the 45s join timeout", out), up.why()
        assert re.search(r"\[node-0\] error: node-1 \(ranks 1\) lost: never joined", out), up.why()
        assert "not starting node-1" in out, up.why()
        assert up.t_exit - t0 < 100, up.why()
        assert project_states(up.project) == {}
    finally:
        up.cleanup()


@docker_test
def test_two_ups_side_by_side_and_the_same_run_folder_refused(tmp_path):
    """A second `up` on the run folder of a running cluster exits 2 naming it and touches nothing;
    an `up` in another run folder runs beside it (its own project, network and folder)."""
    first = Up(tmp_path, "--steps", "40")
    try:
        t0 = time.monotonic()
        while "running" not in project_states(first.project).values() and time.monotonic() - t0 < 120:
            time.sleep(0.5)
        same = subprocess.run([sys.executable, "-m", "launcher", "up", "--mesh", "1x1x1", "--model", "tiny",
                               "--run-dir", str(first.run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert same.returncode == 2, same.stdout + same.stderr
        assert f"the cluster of {first.run_dir} (project {first.project}) is still up" in same.stderr
        other = Up(tmp_path, "--steps", "3")
        try:
            assert other.wait() == 0, other.why()
            # the first run goes on (its `up` still running: following, or summarising after its containers
            # exited) or has ended well; its 40 steps below show the other run did not disturb it
            assert first.proc.poll() in (None, 0), first.why()
        finally:
            other.cleanup()
        assert first.wait() == 0, first.why()
        assert [r["step"] for r in first.metrics()] == list(range(1, 41))
    finally:
        first.cleanup()
