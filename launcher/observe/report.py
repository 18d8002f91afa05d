"""A run's report: PNG figures and one self-contained HTML page (figures embedded, config, summary).

    python -m launcher report                       # the newest run under runs/ with a metrics.jsonl
    python -m launcher report --run-dir runs/mesh-2x2x2
    python -m launcher report --run-dir runs/train-nodes-2x2 --metric-regex 'step (?P<step>[0-9]+) loss (?P<value>[^ ]+)'

Works on any folder with a metrics.jsonl (the schema of simcluster/core/metrics.py; only ``step`` is
required) or the instruments' steps/ of the user's code (rundir.step_rows joins both; a trace of
such a run started with plain ``docker compose up`` is merged here), or a loss the ranks only printed
(cluster.log; ``--metric-regex``, by default the common formats: runlog.printed_series). Draws what the run recorded: loss and
validation loss, tokens/s, peak memory per rank (``rss_mb``), the node x node traffic matrix
(``--traffic 1``; and host x host on rehearsal hosts, from job.json's "hosts") and the pipeline timeline (``--trace-steps``). Writes RUN_DIR/report/*.png and
RUN_DIR/report/index.html and prints the page's path. A folder without metrics.jsonl exits 2.
"""
from __future__ import annotations

import base64
import html
import os
import shutil
import tempfile

from simcluster.core import runlog
from simcluster.core.rundir import METRICS, STEPS, step_rows
from simcluster.core.runlog import newest_run
from simcluster.core.errors import ConfigError
from simcluster.core.hang import HANG_FILE, STACKS_DIR, read_hang


def read_rows(run_dir: str, metric_regex: str | None = None) -> list[dict]:
    """The run's step rows (rundir.step_rows: metrics.jsonl joined with the instruments' step
    records of the user's code), in step order; where no row has a ``loss``, the loss the ranks
    printed (runlog.printed_series: ``metric_regex``, else the common formats) joins them by step.

    Raises:
        ConfigError: no such folder, neither metrics.jsonl, steps/ nor a printed loss, a line of
            metrics.jsonl that is not JSON, or no record with a step; a metric_regex that is not one.
    """
    path = os.path.join(run_dir, METRICS)
    try:
        printed = runlog.printed_series(run_dir, metric_regex)[1]
    except ValueError as e:
        raise ConfigError(f"report: --metric-regex: {e}") from None
    if not os.path.isfile(path) and not os.path.isdir(os.path.join(run_dir, STEPS)) and not printed:
        raise ConfigError(f"report: {path} does not exist; pass --run-dir with a run folder that holds "
                          f"metrics.jsonl (one JSON object per step with at least \"step\", see simcluster/core/metrics.py), "
                          f"the steps/ records of your own code's run, or a loss its ranks printed (--metric-regex)")
    try:
        rows = step_rows(run_dir, strict=True)
    except ConfigError as e:
        raise ConfigError(f"report: {e}") from None
    if printed and not any("loss" in r for r in rows):
        by_step = {r["step"]: r for r in rows}
        for step, value in printed:
            by_step.setdefault(step, {"step": step}).setdefault("loss", value)
        rows = [by_step[s] for s in sorted(by_step)]
    if not rows:
        raise ConfigError(f"report: {run_dir} has no record with an integer \"step\"; write one JSON object per "
                          f"step such as {{\"step\": 1, \"loss\": 2.5}}")
    return rows


def _summary(rows: list[dict], hosts: list[str] | None = None) -> dict:
    last = rows[-1]
    tok = sorted(r["tokens_per_s"] for r in rows[1:] or rows if isinstance(r.get("tokens_per_s"), (int, float)))
    out = {"steps recorded": len(rows), "last step": last["step"]}
    for key in ("loss", "val_loss", "grad_norm"):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if vals:
            out[f"final {key}"] = f"{vals[-1]:.4f}"
    if tok:
        out["median tokens/s"] = f"{tok[len(tok) // 2]:.0f}"
    rss = [max(r["rss_mb"]) for r in rows if isinstance(r.get("rss_mb"), list) and r["rss_mb"]]
    if rss:
        out["peak RSS of any rank"] = f"{max(rss):.0f} MB"
    if isinstance(last.get("traffic"), dict):
        from simcluster.core.metrics import traffic_text
        out["traffic per step (last)"] = traffic_text(last["traffic"], hosts)
    return out


def _img(path: str) -> str:
    with open(path, "rb") as fh:
        data = base64.b64encode(fh.read()).decode("ascii")
    return f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(os.path.basename(path))}"></figure>'


def make_report(run_dir: str, metric_regex: str | None = None) -> tuple[str, list[str]]:
    """Draw every figure the run supports and the HTML page into a fresh folder beside RUN_DIR/report,
    then put it in place of RUN_DIR/report only once complete; returns (page path, PNG paths).

    Raises:
        ConfigError: see ``read_rows``; a config.yaml or trace.json that cannot be read (rundir
            names the file); RUN_DIR/report/ is left as it was.
    """
    rows = read_rows(run_dir, metric_regex)
    config = runlog.read_config(run_dir)  # refuses a garbled one before anything is drawn
    runlog.read_job(run_dir)  # likewise a truncated or edited job.json (its hosts map: node i's host)
    config_text = ""
    if config is not None:  # shown as written (comments and order kept)
        with open(os.path.join(run_dir, runlog.CONFIG), encoding="utf-8") as fh:
            config_text = fh.read()
    trace_path = os.path.join(run_dir, runlog.TRACE)
    if not os.path.isfile(trace_path) and os.path.isdir(os.path.join(run_dir, "trace")):
        from simcluster.core.timeline import merge_found  # the user's code under plain `docker compose up`
        try:
            merge_found(run_dir)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise ConfigError(f"report: {os.path.join(run_dir, 'trace')}/rank-R-step-S.json cannot be merged "
                              f"({type(e).__name__}: {e}); delete the trace/ folder or rerun with --trace-steps S") from None
    events = runlog.read_trace(run_dir)
    from simcluster.launcher.observe import plots  # matplotlib: imported only for a report

    final = os.path.join(run_dir, "report")
    work = tempfile.mkdtemp(prefix=".report-", dir=run_dir)
    os.chmod(work, 0o755)  # mkdtemp's 0700 would hide the report from the user's other tools
    try:
        pngs = _draw(plots, rows, events, config_text, run_dir, work)
        _swap(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return os.path.join(final, "index.html"), [os.path.join(final, os.path.basename(p)) for p in pngs]


def _swap(work: str, final: str) -> None:
    """WORK (complete) becomes FINAL; a previous FINAL is removed only after the move."""
    old = None
    if os.path.lexists(final):
        old = f"{work}-old"
        os.replace(final, old)
    os.replace(work, final)
    if old:
        shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.remove(old)


def _draw(plots, rows: list[dict], events: list[dict] | None, config: str, run_dir: str, out: str) -> list[str]:
    """The figures and index.html written into OUT; the PNGs' paths."""
    pngs = [plots.plot_loss(rows, os.path.join(out, "loss.png")),
            plots.plot_throughput(rows, os.path.join(out, "tokens_per_s.png")),
            plots.plot_memory(rows, os.path.join(out, "memory.png"))]
    traffic = next((r["traffic"] for r in reversed(rows) if isinstance(r.get("traffic"), dict)), None)
    job = runlog.read_job(run_dir) or {}
    hosts = [job["hosts"][n] for n in job["nodes"]] if job.get("hosts") else None  # node i's host (read_job checks)
    if traffic:
        pngs.append(plots.plot_traffic(traffic, os.path.join(out, "traffic.png")))
        if hosts:
            pngs.append(plots.plot_host_traffic(traffic, hosts, os.path.join(out, "traffic_hosts.png")))
    bubbles = {}
    if events is not None:
        from simcluster.core.timeline import bubble
        bubbles = bubble(events)
        steps = sorted(bubbles) or sorted({e["args"]["step"] for e in events if "step" in e.get("args", {})}) or [None]
        pngs.append(plots.plot_timeline(events, os.path.join(out, "timeline.png"), step=steps[0]))
    pngs = [p for p in pngs if p]
    summary = _summary(rows, hosts)
    for step, frac in bubbles.items():
        summary[f"measured bubble, step {step}"] = f"{frac:.3f}"
    page = ["<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>simcluster report: {html.escape(os.path.basename(os.path.abspath(run_dir)))}</title>",
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}img{max-width:100%}"
            "td{padding:2px 12px}pre{background:#f4f4f4;padding:1em}</style></head><body>",
            f"<h1>Run {html.escape(os.path.abspath(run_dir))}</h1><h2>Summary</h2><table>"]
    page += [f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items()]
    page.append("</table>")
    if hang := read_hang(run_dir):  # the stall's diagnosis (train/stallwatch.py), first
        stacks = ", ".join(f"<a href='../{STACKS_DIR}/{html.escape(n)}'>{html.escape(n)}</a>"
                           for n in sorted(os.listdir(os.path.join(run_dir, STACKS_DIR)))
                           if n.endswith(".txt")) if os.path.isdir(os.path.join(run_dir, STACKS_DIR)) else ""
        page.append(f"<h2>Hang</h2><pre>{html.escape(chr(10).join(hang['diagnosis']))}</pre>"
                    f"<p>every rank's record: <a href='../{HANG_FILE}'>{HANG_FILE}</a>; stacks: {stacks}</p>")
    page.append("<h2>Figures</h2>")
    page += [_img(p) for p in pngs]
    if config:
        page.append(f"<h2>Config</h2><pre>{html.escape(config)}</pre>")
    page.append("</body></html>")
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(page))
    return pngs


def _check_regex_reads(folder: str, metric_regex: str) -> None:
    """--metric-regex has something to read: a run whose steps hold no loss, and a printed line it matches.

    Raises:
        ConfigError: the steps hold a loss (the regex would go unused), or no printed line matches.
    """
    if any("loss" in r for r in step_rows(folder)):
        raise ConfigError(f"report: --metric-regex '{metric_regex}' reads a loss the ranks only printed, and the steps "
                          f"of {folder} ({METRICS}) hold one, which the report shows; drop --metric-regex")
    try:
        printed = runlog.printed_series(folder, metric_regex)[1]
    except ValueError as e:
        raise ConfigError(f"report: --metric-regex: {e}") from None
    if not printed:
        raise ConfigError(f"report: --metric-regex '{metric_regex}' matches no line the ranks printed "
                          f"({folder}/cluster.log); fix the regex, e.g. 'loss ([0-9.eE+-]+)'")


def cmd_report(run_dir: str | None, root: str, metric_regex: str | None = None) -> int:
    """``launcher report``: write the report and print where; 0, or raises ConfigError (exit 2)."""
    if run_dir is not None and not run_dir.strip():  # never the newest run in its place
        raise ConfigError(f"report: --run-dir {run_dir!r} is empty; give a run folder of `launcher up`, e.g. launcher "
                          f"report --run-dir runs/mesh-2x2x2, or leave --run-dir out for the newest run")
    folder = newest_run(root) if run_dir is None else run_dir
    runlog.run_folder(folder, "report: --run-dir", "launcher report --run-dir runs/mesh-2x2x2")
    if metric_regex is not None:  # it reads a loss only printed: never unused unsaid
        _check_regex_reads(folder, metric_regex)
    path, pngs = make_report(folder, metric_regex)
    for p in pngs:
        print(p)
    for line in (read_hang(folder) or {}).get("diagnosis", []):
        print(line)
    print(f"report: {path}")
    return 0
