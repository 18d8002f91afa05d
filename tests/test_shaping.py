"""--inter-node-bandwidth / --inter-node-latency: parsing, refusals, and a shaped cluster.

    python -m pytest -q tests/test_shaping.py                 # the Docker test needs the trainer image
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simcluster.launcher.engines.compose.render import node_command
from simcluster.launcher.job.entry import resolve_training
from simcluster.launcher.job.launch import NodeOptions
from simcluster.core.units import rate_bits_per_s
from simcluster.launcher.drills.shaping import tbf_command
from simcluster.launcher.container.layout import shaped_marker
from simcluster.core.config import Config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, bits", [("100mbit", 1e8), ("1gbit", 1e9), ("12.5mbps", 1e8), ("500kbit", 5e5),
                                        ("1Gbit", 1e9)])
def test_rates_in_tc_units(text, bits):
    assert rate_bits_per_s(text) == bits


@pytest.mark.parametrize("text", ["fast", "100", "100mb", "0mbit", "-5mbit", "100 mbit s"])
def test_bad_rates(text):
    assert rate_bits_per_s(text) is None


def test_tbf_command_burst_covers_the_rate():
    assert tbf_command("100mbit")[-1].startswith("tc qdisc replace dev eth0 root tbf rate 100mbit burst 250000 ")
    assert " burst 65536 " in tbf_command("1mbit")[-1]  # at least 64 KiB


def test_shaped_nodes_wait_for_their_marker_and_unshaped_do_not():
    launch = resolve_training(Config(mesh="2x1x1", model="tiny", run_dir="runs/x"),
                              NodeOptions(inter_node_bandwidth="100mbit"))
    cmd = node_command(launch, 1)
    assert cmd[cmd.index("--wait-for") + 1] == shaped_marker("/runs/x", "node-1") == "/runs/x/.network/node-1.ready"
    plain = resolve_training(Config(mesh="2x1x1", model="tiny", run_dir="runs/x"), NodeOptions())
    assert "--wait-for" not in node_command(plain, 1)


@pytest.mark.parametrize("flags, message", [
    (["--inter-node-bandwidth", "fast"], "inter_node_bandwidth: 'fast' is not a tc rate"),
    (["--inter-node-latency", "10ms"], "inter_node_latency: '10ms' cannot be applied: this machine's kernel has no netem"),
])
def test_bad_shaping_options_exit_2_and_write_nothing(tmp_path, flags, message):
    run = tmp_path / "run"
    for command, extra in (("up", []), ("generate", ["--out", str(tmp_path / "c.yml")])):
        proc = subprocess.run([sys.executable, "-m", "launcher", command, "--mesh", "2x1x1", "--model", "tiny",
                               "--run-dir", str(run), *extra, *flags], capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
        assert proc.returncode == 2 and message in proc.stderr, (command, proc.stderr)
    assert not run.exists() and not (tmp_path / "c.yml").exists()


@pytest.mark.docker
def test_shaped_cluster_applies_tbf_before_the_ranks_start(tmp_path, trainer_image):
    run = tmp_path / "shaped"
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--mesh", "2x1x1", "--model", "tiny", "--steps",
                           "2", "--val-every", "0", "--inter-node-bandwidth", "50mbit", "--mount-code", "--run-dir",
                           str(run)], capture_output=True, text=True, timeout=580, cwd=ROOT)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    for node in ("node-0", "node-1"):
        readback = (run / ".network" / f"{node}.ready").read_text()  # `tc -s qdisc show dev eth0` in the node's netns
        assert "qdisc tbf" in readback and "rate 50Mbit" in readback
        lines = out.splitlines()
        shaped = next(i for i, l in enumerate(lines) if l.startswith(f"{node} ") and "network shaped" in l)
        started = next(i for i, l in enumerate(lines) if l.startswith(f"{node} ") and f"[{node}] node " in l)
        assert shaped < started  # the ranks start only after the limit is in place
        assert f"launcher | {node} eth0 limited to 50mbit: qdisc tbf" in out
