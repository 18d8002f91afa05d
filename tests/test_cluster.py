"""Integration tests on real containers: `python -m launcher up` runs the trainer on a cluster.

    python -m pytest -q tests/test_cluster.py            # skips without Docker or the image
    CI=true python -m pytest -q tests/test_cluster.py    # fails instead

Needs the image simcluster/trainer:latest built from this checkout (bash images/build.sh; the
containers run the image's copy of train/ and launcher/) and torch on the host (the reference).
Each test starts the cluster as a user would, with `launcher up --keep` (the stopped containers
stay to be inspected, then `launcher down`), and reads its run folder: metrics.jsonl, cluster.log.
About 3-5 minutes on a quiet 2-core machine.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import COMPOSE_V1, assert_ends_quietly, compose_env, need_torch, noise, reference_losses
from simcluster.launcher.docker.handle import Handle
import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
UP_TIMEOUT_S = 900
BANNER = re.compile(r"^(node-\d+) r(\d+)\s*\| \[simcluster\] rank=(\d+) local_rank=(\d+) world_size=(\d+) "
                    r"host=(\S+) coords=pp(\d+)/dp(\d+)/tp(\d+) stages=\[([\d, ]*)\]$", re.M)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("trainer_image")]


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


def project_containers(project: str) -> dict[str, str]:
    """service -> container id of a compose project (running or stopped)."""
    out = _docker("ps", "-a", "--filter", f"label=com.docker.compose.project={project}",
                  "--format", '{{.Label "com.docker.compose.service"}} {{.ID}}')
    return dict(line.split() for line in out.splitlines() if line.strip())


def inspect(cid: str) -> dict:
    return json.loads(_docker("inspect", cid))[0]


class Cluster:
    """One `launcher up --keep` run in its own run folder (and so its own compose project)."""

    def __init__(self, tmp: Path, mesh: str, *flags: str, compose: str | None = None):
        self.mesh, self.env = mesh, compose_env(compose) if compose else None
        self.run_dir = tmp / f"ct-{mesh}-{uuid.uuid4().hex[:8]}"  # its own compose project (launcher/target.py)
        self.project = Handle.for_run(str(self.run_dir)).project
        self.out = tmp / f"up-{mesh}.out"
        self.cmd = [sys.executable, "-m", "launcher", "up", "--mesh", mesh, "--model", "tiny", *flags,
                    "--run-dir", str(self.run_dir), "--keep"]
        self.live: dict = {}  # what was seen of node-0 while it ran
        self.returncode: int | None = None
        self.wall_s = 0.0

    def run(self, watch: str | None = None) -> "Cluster":
        """Run `launcher up` to the end; if watch names a service, `docker exec id -u` in it while it runs."""
        t0 = time.monotonic()
        with open(self.out, "w") as fh:
            proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, text=True, env=self.env)
            try:
                while proc.poll() is None and time.monotonic() - t0 < UP_TIMEOUT_S:
                    if watch and not self.live:
                        self._watch(watch)
                    time.sleep(0.5)
                if proc.poll() is None:
                    proc.terminate()  # SIGTERM: launcher up stops the cluster itself
                    proc.wait(60)
            finally:
                if proc.poll() is None:
                    proc.kill()
        self.returncode, self.wall_s = proc.returncode, time.monotonic() - t0
        return self

    def _watch(self, service: str) -> None:
        cid = project_containers(self.project).get(service)
        try:
            running = bool(cid) and inspect(cid)["State"]["Running"]
        except subprocess.CalledProcessError:  # listed, then not found by inspect (seen once at load 28): next try
            return
        if running:
            uid = subprocess.run(["docker", "exec", cid, "id", "-u"], capture_output=True, text=True)
            if uid.returncode == 0:
                self.live = {"uid": uid.stdout.strip(), "info": inspect(cid)}

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def why(self) -> str:
        return f"`{' '.join(self.cmd)}` exited {self.returncode} after {self.wall_s:.0f}s:\n{self.output()[-6000:]}"

    def exit_codes(self) -> dict[str, int]:
        return {s: inspect(c)["State"]["ExitCode"] for s, c in project_containers(self.project).items()}

    def metrics(self) -> list[dict]:
        with open(self.run_dir / "metrics.jsonl", encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    def down(self) -> None:
        subprocess.run([sys.executable, "-m", "launcher", "down", "--run-dir", str(self.run_dir)], cwd=ROOT,
                       capture_output=True, timeout=180)


@pytest.fixture(scope="module")
def cluster_2x2x2(tmp_path_factory):
    """2x2x2, tiny, 20 steps on tinyshakespeare; node-0 probed (id -u, inspect) while it runs."""
    assert DATA.is_file(), f"corpus missing: {DATA}"
    c = Cluster(tmp_path_factory.mktemp("cluster"), "2x2x2", "--steps", "20", "--data", str(DATA))
    try:
        yield c.run(watch="node-0")
    finally:
        c.down()


def test_2x2x2_up_exits_0_on_every_node(cluster_2x2x2):
    c = cluster_2x2x2
    assert c.returncode == 0, c.why()
    assert c.exit_codes() == {"node-0": 0, "node-1": 0, "rendezvous": 0}, c.why()
    out = c.output()
    assert "== summary: OK ==" in out and "rank output  8/8 ranks printed" in out and "MISPLACED" not in out, c.why()
    assert_ends_quietly(out, c.run_dir)


def test_2x2x2_node_k_holds_pipeline_stage_k(cluster_2x2x2):
    log = (cluster_2x2x2.run_dir / "cluster.log").read_text(errors="replace")
    banners = BANNER.findall(log)
    assert sorted(int(b[2]) for b in banners) == list(range(8)), log[-4000:]
    for service, prefix_rank, rank, local, world, host, pp, dp, tp, stages in banners:
        k, rank = int(service.split("-")[1]), int(rank)
        assert host == service and int(prefix_rank) == rank and int(world) == 8
        assert stages == str(k) and int(pp) == k and rank in range(4 * k, 4 * k + 4)
        assert int(local) == rank - 4 * k and (int(dp), int(tp)) == ((rank // 2) % 2, rank % 2)


def test_2x2x2_losses_match_the_single_process_reference(cluster_2x2x2):
    """Every step once, loss falls, and each step's loss is the reference's within 1e-4 relative."""
    torch = need_torch()
    from simcluster.core.config import Config
    from simcluster.train.preflight import preflight
    from simcluster.train.reference import run_reference

    c = cluster_2x2x2
    assert c.returncode == 0, c.why()
    rows = c.metrics()
    assert [r["step"] for r in rows] == list(range(1, 21))
    losses = [r["loss"] for r in rows]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 and losses[-1] < 5.0, losses

    run = preflight(Config(mesh="2x2x2", model="tiny", steps=20, data=str(DATA), run_dir=str(c.run_dir / "ref")))
    cfg = run.config
    ran = yaml.safe_load((c.run_dir / "config.yaml").read_text())  # the resolved config rank 0 ran
    for field in ("model", "steps", "seed", "global_batch", "seq_len", "microbatches", "lr", "warmup_steps"):
        assert ran[field] == getattr(cfg, field), field
    assert Path(ran["data"]).name == DATA.name
    torch.set_num_threads(1)
    ref = [r["loss"] for r in run_reference(run)]
    bad = [(i + 1, m, r) for i, (m, r) in enumerate(zip(losses, ref)) if abs(m - r) > 1e-4 * abs(r)]
    assert not bad, f"steps (step, mesh loss, reference loss) off by > 1e-4 relative: {bad}"
    # docs/output.md quotes this run's step 12 and final loss (4 decimals): they must stay what it measures
    doc = (ROOT / "docs" / "output.md").read_text()
    quoted = re.search(r"step 12/20 loss (\d+\.\d{4}) .*\n\s*done steps=20 final_loss=(\d+\.\d{4}) ", doc)
    assert quoted, "docs/output.md no longer quotes the 20-step run's step 12 and done lines"
    assert [float(x) for x in quoted.groups()] == [round(losses[11], 4), round(losses[-1], 4)], (quoted.groups(),
                                                                                                   losses)


def test_node_containers_are_hardened(cluster_2x2x2):
    """node-0 runs as uid 1000 (seen live), publishes no port, drops every capability, read-only rootfs."""
    c = cluster_2x2x2
    assert c.live, "never caught node-0 running to `docker exec id -u` in it; " + c.why()
    assert c.live["uid"] == "1000"
    for info in (c.live["info"], inspect(project_containers(c.project)["node-1"])):
        assert info["Config"]["User"] == "1000:1000"
        assert not info["NetworkSettings"]["Ports"] and not info["HostConfig"]["PortBindings"]
        assert info["HostConfig"]["CapDrop"] == ["ALL"] and info["HostConfig"]["ReadonlyRootfs"] is True


def test_status_reads_the_cluster_from_the_engine(cluster_2x2x2):
    """`launcher status` of the kept cluster: nodes, their ranks (container labels), states and
    the last step (metrics.jsonl), for the run folder and for its compose file."""
    c = cluster_2x2x2
    for target in (["--run-dir", str(c.run_dir)], ["--file", str(c.run_dir / "compose.yml"), "--project", c.project]):
        proc = subprocess.run([sys.executable, "-m", "launcher", "status", *target], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        rows = [line.split() for line in lines[1:5]]
        assert rows[0] == ["NODE", "RANKS", "STATE", "LAST", "STEP"]
        assert rows[1:] == [["node-0", "0-3", "exited", "0", "20"], ["node-1", "4-7", "exited", "0", "20"],
                            ["rendezvous", "-", "exited", "0", "-"]], proc.stdout  # exited, with the exit code
        assert f"run folder {c.run_dir}" in proc.stdout
        assert lines[5].startswith("not running: the run ended at ") and "every container has exited (exit codes: " \
            "node-0 0, node-1 0, rendezvous 0)" in lines[5], proc.stdout  # and says how it ended


def test_4x1x2_under_compose_v1(tmp_path):
    """Four nodes, one pipeline stage each, end to end under Compose v1 (docker-compose 1.29):
    every node exits 0, each step once, the end is quiet, and each step's loss equals the
    one-process reference within 1e-4 relative."""
    c = Cluster(tmp_path, "4x1x2", "--steps", "3", "--data", str(DATA), compose=COMPOSE_V1)
    try:
        c.run()
        assert c.returncode == 0, c.why()
        assert c.exit_codes() == {"node-0": 0, "node-1": 0, "node-2": 0, "node-3": 0, "rendezvous": 0}, c.why()
        assert "rank output  8/8 ranks printed" in c.output() and "MISPLACED" not in c.output()
        assert not noise(c.output()), noise(c.output())[:5]  # quiet under Compose v1 too
        losses = [r["loss"] for r in c.metrics()]
        assert [r["step"] for r in c.metrics()] == [1, 2, 3]
        ref = reference_losses("4x1x2", 3, DATA)
        assert all(abs(m - r) <= 1e-4 * abs(r) for m, r in zip(losses, ref)), (losses, ref)
    finally:
        c.down()
