"""Following a running cluster: every container's log, progress, and the fault watch.

    python -m launcher up --mesh 2x2x2 --steps 20      # (used by launcher/engines/skeleton.py)

``Stream`` follows each container's log (the SDK's log stream, one thread per container) until
all have ended, prefixes each line ``node-K rR |``, prints a progress line from rank 0's step
lines, checks each rank ran on the node its rank says, records the rendezvous' LOST lines and
remembers each rank's latest traceback as it streams by (launcher/observe/failures.py).
``Watch`` runs beside it about once a second, on a compose project's or a swarm stack's
containers: it starts late nodes when due (``--start-late``, compose only), kills the container
of a node the rendezvous declared lost (unpausing a frozen one first), and once the rendezvous
has exited kills whatever container of the run is still up; it learns container states from the
engine's event stream.
"""
from __future__ import annotations

import queue
import re
import sys
import threading
import time

from simcluster.launcher.docker.client import Client
from simcluster.launcher.docker.compose_cli import compose
from simcluster.launcher.docker.container import kill, log_lines, log_time
from simcluster.launcher.docker.cluster import Events
from simcluster.launcher.job.launch import Launch
from simcluster.launcher.container.layout import RDZV_HOST
from simcluster.core.layout import node_of
from simcluster.launcher.observe.failures import RankTrace
from simcluster.core.rundir import StepsTail
from simcluster.launcher.observe.progress import Bar, Progress, parse_done, parse_step, split_rank
from simcluster.launcher.docker.handle import Handle

EXITED = re.compile(r"^rendezvous: (\S+) \(ranks [^)]*\) exited -?\d+(?: \((.*)\))?$")
HOST_CHECK_S = 2.0  # with rehearsal hosts (up --hosts), each host's engine is pinged this often


def _pump(service: str, container, out: queue.Queue) -> None:
    try:
        for line in log_lines(container, timestamps=True):
            t, text = log_time(line)
            out.put((service, text, t))
    except Exception as e:  # noqa: BLE001 - the container went away under the stream
        out.put((service, f"(log stream ended: {e})", None))
    out.put((service, None, None))


class Stream:
    """Follows every container's log until all containers stopped; tracks progress and ranks."""

    def __init__(self, launch: Launch, log_path: str, quiet: bool, progress_every: float,
                 metric_regex: str | None = None):
        self.launch, self.quiet, self.every = launch, quiet, progress_every
        self.metric_regex = metric_regex  # how the summary reads a printed loss (None: series.LOSS_REGEX)
        self.names = launch.names
        self.width = max(len(n) for n in self.names + [RDZV_HOST]) + 4
        self.progress = Progress()
        self.bar = Bar() if Bar.wanted(sys.stdout) else None  # a terminal: a progress bar, else plain lines
        self.seen_ranks: dict[int, str] = {}
        self.per_rank = True  # the lines carry torchrun's [rankR]: prefix (Compose, Swarm); Slurm's job output does not
        self.misplaced: list[str] = []
        self.first_worker_s: float | None = None
        self.log = open(log_path, "a", encoding="utf-8", buffering=1)  # line-buffered: it grows as the run goes (tail -f)
        self.t0 = time.monotonic()
        self.last_progress = 0.0
        self.lost: list[str] = []  # "node-1 (ranks 2-3): reason", from the rendezvous' LOST lines
        self.lost_s: float | None = None  # seconds after start of the first LOST line
        self.lost_t: float | None = None  # its UNIX time
        self.forced: list[str] = []  # containers up kills because they outlived the rendezvous
        self.timed_out: float | None = None  # the --wall-timeout-s (s) once up has killed the run for it
        self.reasons: dict[str, str] = {}  # node -> why it stopped, from the rendezvous' report lines
        self.traces: dict[int, RankTrace] = {}  # rank -> its latest traceback or C++ abort, as it streams by
        self.failed_at: dict[int, float] = {}  # rank -> UNIX time its container wrote its first complete traceback or abort
        self.placed: dict[str, str] = {}  # service -> the rehearsal host it runs on (up --hosts; else empty)
        self.lost_hosts: dict[str, list[str]] = {}  # host -> the services that went with it, once it stopped answering
        self._queue: queue.Queue | None = None

    def show(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")

    def handle(self, service: str, line: str, t: float | None = None) -> None:
        """One line a container wrote (t: when, UNIX time, from Docker's stamp; else now)."""
        rank, text = split_rank(line)
        exited = EXITED.match(text) if service == RDZV_HOST else None
        if exited and exited.group(2):
            self.reasons[exited.group(1)] = exited.group(2)
        if service == RDZV_HOST and text.startswith("rendezvous: LOST "):
            self.lost.append(text[len("rendezvous: LOST "):])
            if self.lost_s is None:
                self.lost_s, self.lost_t = time.monotonic() - self.t0, time.time()
        if rank is not None:
            text = text.removeprefix(f"[rank{rank}]: ")  # torch's own excepthook prefixes a rank's traceback too
            if self.first_worker_s is None:
                self.first_worker_s = time.monotonic() - self.t0
            trace = self.traces.setdefault(rank, RankTrace())
            trace.feed(text)
            if rank not in self.failed_at and (trace.done is not None or trace.abort):
                self.failed_at[rank] = t if t is not None else time.time()
            if rank not in self.seen_ranks:  # torchrun prefixes every line of a rank with [rankR]:
                self.seen_ranks[rank] = service
                k = node_of(rank, self.launch.nproc_per_node)
                if k >= len(self.names) or self.names[k] != service:
                    self.misplaced.append(f"rank {rank} ran on {service}, expected on {self.names[k] if k < len(self.names) else '?'}")
        step = parse_step(text) if rank == 0 else None
        done = parse_done(text) if rank == 0 else None
        if done:
            self.progress.done = done
        prefix = f"{service} r{rank}" if rank is not None else service
        line = f"{prefix:<{self.width}}| {text}"
        if step and self.quiet:  # --quiet hides rank 0's step lines; the log keeps them (a printed loss is read there)
            self.log.write(line + "\n")
        else:
            self.show(line)

    def on_metrics(self, rows: list[dict]) -> None:
        """New metrics.jsonl rows (the schema of simcluster/core/metrics.py), read at once: update the progress
        with each, then maybe show one line of the newest (rows that arrive together after a quiet
        spell, as a short job's do at its end, print no stale step)."""
        rows = [row for row in rows if isinstance(row.get("step"), int)]
        if not rows:
            return
        for row in rows:
            self.progress.update({"step": row["step"], "total": row.get("total_steps") or 0, "loss": row.get("loss"),
                                  "tokens_per_s": row.get("tokens_per_s"), "step_time": row.get("step_time_s")})
        row = rows[-1]
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(self.progress)
        if now - self.last_progress >= self.every or row["step"] == row.get("total_steps"):
            self.last_progress = now
            text = f"{'launcher':<{self.width}}| {self.progress.line()}"
            if self.bar is None:
                self.show(text)
            else:  # the bar shows it; the log keeps the line
                self.log.write(text + "\n")

    def tracebacks(self) -> dict[int, list[str]]:
        """rank -> the lines of its latest Python traceback to show, ending with the exception line
        (``ValueError: boom``), for the ranks that printed one, whatever its depth; else a C++
        abort's line (``terminate called ...``) on its own. The rules: launcher/observe/failures.py."""
        return {rank: lines for rank, t in sorted(self.traces.items()) if (lines := t.lines())}

    def follow(self, found: dict, watch: "Watch | None" = None) -> None:
        """Show every container's log until all ended; ``watch.tick()`` runs about every second
        and may start more containers (returned as service -> container) to follow too."""
        q: queue.Queue = queue.Queue()
        self._queue = q
        ended: set[str] = set()

        def start(more: dict) -> int:
            for service, container in more.items():
                threading.Thread(target=_pump, args=(service, container, q), daemon=True).start()
            return len(more)

        open_streams = start(found)
        last_tick = time.monotonic()
        try:
            while open_streams or (watch and watch.pending):
                try:
                    service, line, t = q.get(timeout=1.0)
                    if line is None:
                        if service not in ended:  # abandon() ends a stream once, its pump may end it again
                            ended.add(service)
                            open_streams -= 1
                    else:
                        self.handle(service, line, t)
                except queue.Empty:
                    pass
                if watch and time.monotonic() - last_tick >= 1.0:
                    last_tick = time.monotonic()
                    open_streams += start(watch.tick(self))
        finally:
            if self.bar is not None:
                self.bar.close()


    def abandon(self, service: str) -> None:
        """Stop following service's log (its host is gone: the stream may never end by itself)."""
        if self._queue is not None:
            self._queue.put((service, None, None))

    def host_lost(self, host: str) -> None:
        """A rehearsal host stopped answering: name it and the nodes that went with it, stop following them."""
        gone = sorted(s for s, h in self.placed.items() if h == host)
        self.lost_hosts[host] = gone
        self.show(f"{'launcher':<{self.width}}| {host} stopped answering (its engine is gone or cut off): "
                  f"{', '.join(gone) or 'no node'} went with it")
        for service in gone:
            self.reasons.setdefault(service, f"lost with {host}")
            self.abandon(service)


class Watch:
    """Runs during ``up``: starts late nodes when due, kills the container of a node the
    rendezvous declared lost (it is frozen or cut off, if not dead already), and once the
    rendezvous has exited kills every container of the run still up after up's --exit-grace-s (nodes
    leave by themselves about 3 s after it); a rendezvous still up as long after every node exited too.
    Container states come from the daemons' event stream (launcher/docker/cluster.py Events), not from polling."""

    def __init__(self, client: Client, handle: Handle, run_dir: str, since: float, total_steps: int | None, opts,
                 t0: float):
        """client: the Docker client of the run's containers (launcher/docker/client.py); since: UNIX time the
        containers were started (an older metrics.jsonl is a previous run's);
        total_steps: the job's steps when the launcher knows them (--total-steps), for the ETA;
        opts: `up`'s UpOptions (job/sections.py): start_late (service -> seconds after start),
        exit_grace_s, and wall_timeout_s, from t0 (the command's time.monotonic()): past it every
        container of the run is killed and the run fails as timed out."""
        self.client, self.handle, self.t0 = client, handle, time.monotonic()
        self.deadline = opts.deadline(t0)
        self.metrics = StepsTail(run_dir, since=since, total_steps=total_steps)
        self.late = dict(opts.start_late)  # service -> seconds after start
        self.grace_s = opts.exit_grace_s
        self.rdzv_gone: float | None = None
        self.nodes_gone: float | None = None
        self.events = Events(client, handle.project, handle.stack)
        self.events.start()
        self.next_host_check = 0.0

    def close(self) -> None:
        self.events.close()

    @property
    def pending(self) -> int:
        return len(self.late)

    def tick(self, stream: Stream) -> dict:
        stream.on_metrics(self.metrics.rows())
        now = time.monotonic()
        started: dict = {}
        named = {x.split()[0] for x in stream.lost}
        for service, delay in sorted(self.late.items()):
            if self.rdzv_gone is not None or service in named:
                stream.show(f"{'launcher':<{stream.width}}| not starting {service}: the job has already failed")
                del self.late[service]
            elif now - self.t0 >= delay:
                stream.show(f"{'launcher':<{stream.width}}| starting {service} {now - self.t0:.0f}s late (--start-late)")
                compose(self.handle.project, self.handle.file, "up", "-d", "--no-deps", service, capture_output=True)
                del self.late[service]
                container = self.client.containers(self.handle.project).get(service)
                if container is not None:
                    started[service] = container
        if self.client.hosts and now >= self.next_host_check:
            self.next_host_check = now + HOST_CHECK_S
            for host in self.client.silent_hosts():
                if host not in stream.lost_hosts and host in stream.placed.values():  # a host this attempt uses
                    stream.host_lost(host)
        gone_with_hosts = {s for nodes in stream.lost_hosts.values() for s in nodes}
        state = {s: st for s, st in self.events.state.items() if s not in gone_with_hosts}
        lost = named - set(stream.forced)
        if state.get(RDZV_HOST) in ("exited", "removed"):
            self.rdzv_gone = self.rdzv_gone or now
        nodes = [st for svc, st in state.items() if svc != RDZV_HOST]
        if nodes and not self.late and all(st in ("exited", "removed") for st in nodes):
            self.nodes_gone = self.nodes_gone or now  # the rendezvous itself may be the one frozen
        late_kill = (self.rdzv_gone is not None and now - self.rdzv_gone >= self.grace_s) or \
            (self.nodes_gone is not None and now - self.nodes_gone >= self.grace_s)
        if self.deadline and now >= self.deadline[0] and not stream.timed_out:
            stream.timed_out = self.deadline[1]
            stream.show(f"{'launcher':<{stream.width}}| --wall-timeout-s {self.deadline[1]:g} passed; killing every "
                        f"container of the run")
            for container in self.client.containers(self.handle.project, self.handle.stack).values():
                kill(container)
        victims = sorted(svc for svc, st in state.items()
                         if st in ("running", "paused") and svc not in stream.forced and (late_kill or svc in lost))
        if victims:
            found = self.client.containers(self.handle.project, self.handle.stack)
            for service in victims:
                why = ("the rendezvous declared it lost" if service in lost else "the rendezvous ended"
                       if self.rdzv_gone is not None else "every node has exited")
                stream.show(f"{'launcher':<{stream.width}}| {service} is {state[service]} but {why}; killing it")
                stream.forced.append(service)
                if service in found:
                    kill(found[service])
        return started
