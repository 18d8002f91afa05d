"""The report's figures, drawn with matplotlib's non-interactive Agg backend into PNG files.

    python -m launcher report --run-dir runs/mesh-2x2x2     # (launcher/observe/report.py calls these)

Each ``plot_*`` takes plain data (rows of metrics.jsonl, a traffic totals dict, trace events),
writes one PNG and returns its path, or None when the run has nothing to draw for it.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "backward-input": "#c44e52", "backward-weight": "#8172b2",
          "comm": "#999999", "optimizer": "#55a868"}


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_loss(rows: list[dict], path: str) -> str | None:
    """Training loss (and validation loss where recorded) against step."""
    train = [(r["step"], r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float))]
    val = [(r["step"], r["val_loss"]) for r in rows if isinstance(r.get("val_loss"), (int, float))]
    if not train and not val:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss", color="#4c72b0")
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss", color="#dd8452")
    ax.set(xlabel="step", ylabel="loss", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_throughput(rows: list[dict], path: str) -> str | None:
    """Tokens per second of each step."""
    pts = [(r["step"], r["tokens_per_s"]) for r in rows if isinstance(r.get("tokens_per_s"), (int, float))]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(*zip(*pts), color="#55a868")
    ax.set(xlabel="step", ylabel="tokens/s", title="Throughput (all ranks together)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_memory(rows: list[dict], path: str) -> str | None:
    """Peak RSS (MB) of each rank over the run: the largest ``rss_mb[rank]`` of any step."""
    lists = [r["rss_mb"] for r in rows if isinstance(r.get("rss_mb"), list) and r["rss_mb"]]
    if not lists:
        return None
    n = max(len(x) for x in lists)
    peak = [max(x[i] for x in lists if i < len(x)) for i in range(n)]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * n + 2), 3.5))
    ax.bar(range(n), peak, color="#8172b2")
    ax.set(xlabel="rank", ylabel="peak RSS (MB)", title="Peak memory per rank")
    ax.set_xticks(range(n))
    return _save(fig, path)


def _matrix(grid: list[list[float]], labels: list[str], cmap: str, who: str, title: str, path: str) -> str:
    """A square MB matrix (rows: from, columns: to), each cell's value written in it, saved to path."""
    n = len(grid)
    fig, ax = plt.subplots(figsize=(2.2 + 1.3 * n, 1.8 + 1.2 * n))
    im = ax.imshow(grid, cmap=cmap)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{grid[i][j]:.2f}", ha="center", va="center",
                    color="white" if grid[i][j] > 0.6 * max(map(max, grid)) else "black")
    ax.set(xlabel=f"to {who}", ylabel=f"from {who}", xticks=range(n), yticks=range(n), xticklabels=labels,
           yticklabels=labels, title=title)
    fig.colorbar(im, ax=ax, label="MB")
    return _save(fig, path)


def plot_traffic(totals: dict, path: str) -> str | None:
    """Node x node matrix of one step's bytes (all ranks): p2p sends between nodes, collectives
    inside a node on the diagonal; collectives spanning nodes noted in the title."""
    links = {k: v for k, v in totals.get("links", {}).items() if "->" in k}
    if not links:
        return None
    n = 1 + max(int(x) for k in links for x in k.split("->"))
    grid = [[links.get(f"{i}->{j}", 0) / 1e6 for j in range(n)] for i in range(n)]
    span = totals.get("links", {}).get("span", 0)
    return _matrix(grid, [str(i) for i in range(n)], "Blues", "node",
                   f"MB per step by link\n(collectives spanning nodes: {span:,} bytes)", path)


def plot_host_traffic(totals: dict, hosts: list[str], path: str) -> str | None:
    """Host x host matrix of one step's bytes between nodes on different hosts (simcluster/core/metrics.py host_links;
    hosts: node i's host), for rehearsal hosts (``up --hosts``)."""
    from simcluster.core.metrics import host_links

    names = list(dict.fromkeys(hosts))
    pairs = host_links(totals, hosts)
    grid = [[pairs.get(f"{a}->{b}", 0) / 1e6 for b in names] for a in names]
    return _matrix(grid, names, "Oranges", "host", "MB per step between hosts\n(p2p sends; same-host pairs 0)", path)


def _color(name: str, cat: str) -> str | None:
    if cat == "compute":
        return COLORS[name.split(" ")[0]]
    if name.startswith("Optimizer.step"):
        return COLORS["optimizer"]
    if name.startswith("gloo:"):
        return COLORS["comm"]
    if name.startswith(("aten::linear", "aten::_scaled_dot_product", "aten::matmul")):  # the user's code's layers
        return COLORS["forward"]
    if name.startswith("autograd::engine::evaluate_function"):
        return COLORS["backward"]
    return None


def plot_timeline(events: list[dict], path: str, step: int | None = None) -> str | None:
    """One traced step: a row per rank, forward/backward per microbatch, gloo work (grey, on the
    rank's gloo row), the optimizer; milliseconds from the step's first event."""
    xs = [e for e in events if e.get("ph") == "X" and (step is None or e.get("args", {}).get("step") == step)]
    xs = [e for e in xs if _color(e["name"], e.get("cat", "")) is not None]
    if not xs:
        return None
    t0 = min(e["ts"] for e in xs)
    ranks = sorted({e["tid"] % 1000 for e in xs})
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(ranks) + 2.0))
    for e in xs:
        rank, gloo = e["tid"] % 1000, e["tid"] >= 1000
        y = ranks.index(rank) + (0.3 if gloo else 0)
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 0.05))], (y - 0.15, 0.25 if not gloo else 0.12),
                       color=_color(e["name"], e.get("cat", "")))
        if e.get("cat") == "compute" and e["dur"] > 0:
            ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, y - 0.02, e["name"].split(" ")[1], ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set(xlabel="ms from the step's start", title=f"Pipeline timeline, step {step}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=7, ncol=len(COLORS),
              frameon=False)
    return _save(fig, path)


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path
