"""Pure parsing of the cluster's log lines: rank prefixes, trainer banners, step and done lines.

    python -c "from simcluster.launcher.observe.progress import parse_step; print(parse_step('step 3/10 loss 2.5 tokens_per_s 900'))"

Formats (from the trainer; torchrun prefixes each worker line with ``[rankR]:``):
    [simcluster] rank=5 local_rank=1 world_size=8 host=node-1 coords=pp1/dp0/tp1 stages=[1]
    step 12/300 loss 3.2145 grad_norm 1.2300 lr 3.00e-03 step_time 0.512s tokens_per_s 4000 rss_mb 312
    done steps=300 final_loss=1.8123 tokens_per_s=4100 wall_s=250.1 run_dir=/runs/x
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:(.*)$")
_STEP = re.compile(r"^step (\d+)/(\d+)\s*(.*)$")
_KV = re.compile(r"(\w+)=(\S+)")


def split_rank(line: str) -> tuple[int | None, str]:
    """``[rank3]:text`` -> (3, "text"); other lines -> (None, line)."""
    m = _RANK_PREFIX.match(line)
    return (int(m.group(1)), m.group(2)) if m else (None, line)


def _number(text: str) -> float | None:
    try:
        return float(text.rstrip("s"))
    except ValueError:
        return None


def parse_step(text: str) -> dict | None:
    """A trainer step line -> {"step", "total", "loss", "tokens_per_s", "step_time", ...}; else None.

    Values after ``step a/b`` come as ``name value`` pairs; numbers become floats
    (a trailing ``s`` unit is dropped, so ``step_time 0.512s`` -> 0.512).
    """
    m = _STEP.match(text.strip())
    if not m:
        return None
    out: dict = {"step": int(m.group(1)), "total": int(m.group(2))}
    words = m.group(3).split()
    for name, value in zip(words[::2], words[1::2]):
        out[name] = _number(value)
    return out


def parse_kv(text: str) -> dict[str, str]:
    """``a=1 b=x`` pairs of a line (banner, done line, probe line) as strings."""
    return dict(_KV.findall(text))


def parse_done(text: str) -> dict | None:
    """The trainer's final ``done steps=... final_loss=...`` line -> its fields; else None."""
    text = text.strip()
    return parse_kv(text) if text.startswith("done ") else None


def format_duration(seconds: float | None) -> str:
    """``2h03m``, ``4m07s``, ``9s``; ``?`` for None."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass
class Progress:
    """Tracks rank 0's step lines; ``line()`` is the progress line, ETA from the observed rate."""

    step: int = 0
    total: int = 0
    loss: float | None = None
    tokens_per_s: float | None = None
    step_time: float | None = None
    first: tuple[int, float] | None = None  # (step, monotonic time) of the first step seen
    last_time: float = 0.0
    done: dict = field(default_factory=dict)

    def update(self, fields: dict, now: float | None = None) -> None:
        """Record a parse_step() result."""
        now = time.monotonic() if now is None else now
        self.step, self.total = fields["step"], fields["total"]
        self.loss = fields.get("loss", self.loss)
        self.tokens_per_s = fields.get("tokens_per_s", self.tokens_per_s)
        self.step_time = fields.get("step_time", self.step_time)
        if self.first is None:
            self.first = (self.step, now)
        self.last_time = now

    def eta_s(self) -> float | None:
        """Seconds left: remaining steps times the seconds per step seen so far (or step_time)."""
        if not self.total:
            return None
        left = self.total - self.step
        if self.first and self.step > self.first[0]:
            return left * (self.last_time - self.first[1]) / (self.step - self.first[0])
        return left * self.step_time if self.step_time else None

    def line(self) -> str:
        """``progress: step 6/11 (55%) loss 4.0000 tokens/s 100 ETA 5s`` (unknown fields left out)."""
        parts = [f"progress: step {self.step}" + (f"/{self.total} ({100.0 * self.step / self.total:.0f}%)"
                                                   if self.total else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.tokens_per_s is not None:
            parts.append(f"tokens/s {self.tokens_per_s:.0f}")
        if self.total:
            parts.append(f"ETA {format_duration(self.eta_s())}")
        return " ".join(parts)


class Bar:
    """A terminal progress bar (rich) with step, loss, tokens/s and ETA; lines printed while it
    runs appear above it (rich redirects stdout). ``Bar.wanted(stream)`` says whether to use one:
    only on a terminal with rich installed, so logs and CI output keep the plain progress lines."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
            TimeRemainingColumn

        self.rich = RichProgress(TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
                                 TextColumn("{task.fields[info]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                 redirect_stdout=True, redirect_stderr=True, transient=False)
        self.task = None

    @staticmethod
    def wanted(stream) -> bool:
        """True when ``stream`` is a terminal and rich can be imported."""
        try:
            import rich  # noqa: F401
        except ImportError:
            return False
        return hasattr(stream, "isatty") and stream.isatty()

    def update(self, p: Progress) -> None:
        """Show ``p``'s step of total, loss and tokens/s; starts the bar on its first call."""
        info = " ".join(x for x in (f"loss {p.loss:.4f}" if p.loss is not None else "",
                                     f"tokens/s {p.tokens_per_s:.0f}" if p.tokens_per_s is not None else "") if x)
        if self.task is None:
            self.rich.start()
            self.task = self.rich.add_task("train", total=p.total or None, info=info)
        self.rich.update(self.task, completed=p.step, total=p.total or None, info=info)

    def close(self) -> None:
        if self.task is not None:
            self.rich.stop()
            self.task = None
