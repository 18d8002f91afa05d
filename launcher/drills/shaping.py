"""Shaping the network between simulated nodes: ``--inter-node-bandwidth RATE`` with tc tbf.

    python -m launcher up --mesh 2x1x1 --model tiny --steps 5 --inter-node-bandwidth 100mbit

The nodes run as an unprivileged user with every capability dropped and no-new-privileges, so
they cannot run tc themselves. After ``compose up -d`` the launcher starts, per node, a
short-lived root helper container of ``NETTOOLS_IMAGE`` (Debian + iproute2, images/build.sh)
in that node's network namespace with NET_ADMIN only; it runs ``layout.tbf_command`` on eth0
(tbf shapes egress: limiting every node's own eth0 limits both directions between nodes;
ranks of one node talk over loopback, untouched). The launcher then writes the node's marker
(``layout.shaped_marker``, holding the ``tc -s qdisc`` readback) and the node wrapper, which
waits for it (``--wait-for``), starts the ranks: the limit holds from the first collective.
Delay (``--inter-node-latency``) needs netem, which this machine's kernel lacks: refused at
validation (``launcher.launch.check_node_options``).
"""
from __future__ import annotations

import os
import re
import shutil

from simcluster.launcher.docker.client import LauncherError
from simcluster.launcher.container.layout import SHAPED_DIR, shaped_marker
from simcluster.core.errors import ConfigError
from simcluster.core.units import rate_bits_per_s

NETTOOLS_IMAGE = "simcluster/nettools:latest"


def tbf_command(rate: str) -> list[str]:
    """The shell command that limits eth0's egress to ``rate`` with tc's token bucket filter, then
    prints the qdisc back. burst: 20 ms at the rate, at least 64 KiB (tbf needs burst >= rate /
    kernel HZ); latency 50 ms bounds the queue."""
    burst = max(64 * 1024, int(rate_bits_per_s(rate) / 8 * 0.02))
    return ["sh", "-c", f"tc qdisc replace dev eth0 root tbf rate {rate} burst {burst} latency 50ms "
            f"&& tc -s qdisc show dev eth0"]


def check(launch, engine, start_late: dict) -> None:
    """The check of --inter-node-bandwidth's use by ``launcher up`` (its rate is checked with the node
    options, launch.check_node_options; `generate` refuses it at the edge, job/options.py resolve): only the
    compose target applies it, no node may start late (its marker would never be written), and the
    helper image must exist.

    engine: the Engine (launcher/engines/base.py; its supports_shaping).

    Raises:
        ConfigError: an engine without shaping, or --start-late, naming the fix.
        LauncherError: the helper image is missing, naming the build command.
    """
    if not launch.node.inter_node_bandwidth:
        return
    if not engine.supports_shaping:
        raise ConfigError(f"--target {engine.name}: --inter-node-bandwidth is not wired for {engine.name} (the Compose "
                          f"engine applies the shaping helper and the nodes' start marker); use --target compose")
    if start_late:
        raise ConfigError("--start-late cannot be combined with --inter-node-bandwidth (a late node's network "
                          "would not be shaped); drop one of them")
    from simcluster.launcher.docker import images

    if images.image_created(NETTOOLS_IMAGE) is None:
        raise LauncherError(f"--inter-node-bandwidth needs the helper image {NETTOOLS_IMAGE} (iproute2); build it "
                            f"with bash images/build.sh")


def clear(run_dir: str) -> None:
    """Remove the markers of an earlier start (each start shapes its fresh containers again)."""
    shutil.rmtree(os.path.join(run_dir, SHAPED_DIR), ignore_errors=True)


def apply(client, launch, containers: dict, run_dir: str, show) -> dict[str, str]:
    """Limit each node's eth0 to the launch's rate, then write its marker; returns node -> the
    ``tc -s qdisc show dev eth0`` readback. ``containers``: service -> container, of client's daemon
    (launcher/docker/client.py Client), which runs the helpers.

    Raises:
        LauncherError: a node container is missing or its helper failed.
    """
    rate = launch.node.inter_node_bandwidth
    os.makedirs(os.path.join(run_dir, SHAPED_DIR), exist_ok=True)
    out = {}
    for name in launch.names:
        if name not in containers:
            raise LauncherError(f"cannot shape {name}: its container is not there")
        text = client.run_in_netns(NETTOOLS_IMAGE, tbf_command(rate), containers[name])
        marker = shaped_marker(run_dir, name)
        with open(marker + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(marker + ".tmp", marker)
        first = text.strip().splitlines()[0] if text.strip() else "?"
        show(f"launcher | {name} eth0 limited to {rate}: {first}")
        out[name] = text
    return out
