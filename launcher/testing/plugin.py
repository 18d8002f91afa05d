"""The pytest plugin: a ``simcluster`` fixture that runs your code on a fresh simulated cluster.

    pip install "simcluster[pytest]"         # registers this module (entry point pytest11 "simcluster")
    python -m pytest -n 2 tests              # with pytest-xdist: in parallel, each run in its own folder
    python -m pytest -p simcluster.launcher.testing.plugin tests   # a checkout, nothing installed

    @pytest.mark.simcluster(mesh="2x2x2", wall_timeout_s=300)
    def test_loss_falls(simcluster):
        run = simcluster(script="train.py", args=["--steps", "5"])
        assert run.ok, run.summary
        assert run.values("loss")[-1] < run.values("loss")[0]

Rules:
- ``simcluster(**kw)`` is ``simcluster.run(**kw)`` (launcher/api.py) with defaults from the test's
  ``@pytest.mark.simcluster(...)`` marks (test, class, module: the closest wins per keyword), each
  run in its own folder under the test's tmp_path (run-1, run-2, ...), ``wall_timeout_s``
  DEFAULT_WALL_TIMEOUT_S unless given. ``simcluster.compare(**kw)`` is ``simcluster.compare`` alike
  (compare-1/a-..., b-...). Folders, compose projects and networks derive from the folder's path,
  so pytest-xdist workers never share one.
- Teardown, whatever the test did (passed, raised, timed out, Ctrl-C): every container and network
  of each of its runs' compose projects is removed.
- A failed test's report gets a section per run: the summary `launcher up` printed (the failing
  ranks' tracebacks in it), or the end of its cluster.log when it had none.
- No Docker engine or Compose: the test is skipped with the reason, or fails under CI=true;
  ``--simcluster-docker skip|fail`` (ini ``simcluster_docker``) chooses either way.
- The trainer image is checked once per session and built when missing, from the installed
  package alone (its build script is package data), under a lock the xdist workers share.
"""
from __future__ import annotations

import fcntl
import glob
import inspect
import os

import pytest

DEFAULT_WALL_TIMEOUT_S = 900.0  # a run of a test is killed after this, unless wall_timeout_s says otherwise
LOG_TAIL = 40  # lines of cluster.log a failed test's report shows of a run that wrote no summary
RUNS = pytest.StashKey[list]()  # the run folders of a test, in order


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simcluster", "simulated cluster (simcluster)")
    group.addoption("--simcluster-docker", choices=("skip", "fail"), default=None,
                    help="without a Docker engine: skip the tests that need it, or fail them (default: fail when "
                         "CI=true, else skip)")
    parser.addini("simcluster_docker", "skip or fail the simcluster tests without a Docker engine (as "
                  "--simcluster-docker)", default="")


def pytest_configure(config: pytest.Config) -> None:
    _missing_docker(config)  # the ini value checked always, with or without Docker
    config.addinivalue_line("markers", "simcluster(**defaults): keyword defaults of the simcluster fixture's runs "
                            "(mesh=, nodes=, nproc_per_node=, wall_timeout_s=, any `launcher up` option)")


def _missing_docker(config: pytest.Config) -> str:
    """skip or fail: the option, else the ini value, else fail under CI=true.

    Raises:
        pytest.UsageError: an ini value other than skip or fail.
    """
    choice = config.getoption("simcluster_docker") or config.getini("simcluster_docker")
    if choice not in ("", "skip", "fail"):
        raise pytest.UsageError(f"simcluster_docker = {choice!r} in the ini file: choose skip or fail, e.g. "
                                f"simcluster_docker = skip")
    return choice or ("fail" if os.environ.get("CI", "").lower() == "true" else "skip")


@pytest.fixture(scope="session")
def simcluster_docker(pytestconfig: pytest.Config) -> None:
    """A Docker engine and a Compose CLI answer; otherwise the test is skipped (or fails, see the
    module docstring) naming what is missing."""
    from simcluster.launcher.docker.compose_cli import compose_cli
    from simcluster.launcher.docker.client import Client, LauncherError

    try:
        Client().info()  # raises LauncherError naming the fix when no daemon answers
        compose_cli()
    except LauncherError as e:
        if _missing_docker(pytestconfig) == "fail":
            pytest.fail(f"simcluster: {e} (--simcluster-docker skip skips instead)", pytrace=False)
        pytest.skip(f"simcluster: {e}")


@pytest.fixture(scope="session")
def simcluster_image(simcluster_docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The trainer image's name, built once when missing (this installation's build script),
    under a file lock shared by the xdist workers of this session."""
    from simcluster.launcher.container.layout import IMAGE
    from simcluster.launcher.engines.image import ensure_image

    lock = tmp_path_factory.getbasetemp().parent / "simcluster-image.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            ensure_image(IMAGE, build=False)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return IMAGE


def _run_keys() -> set:
    """What simcluster.run takes: its own keywords and every `up` option (the request's sections' names)."""
    from simcluster.launcher.api import run
    from simcluster.launcher.job.fields import FIELDS, GENERATE_ONLY

    return (set(inspect.signature(run).parameters) - {"options"}) | (set(FIELDS) - set(GENERATE_ONLY))


def _compare_keys() -> set:
    """What simcluster.compare takes: `launcher compare`'s options by the same names (compare.py COMPARE_KEYS)."""
    from simcluster.launcher.compare import COMPARE_KEYS

    return set(COMPARE_KEYS)


def _defaults(item: pytest.Item) -> dict:
    """The keyword defaults of the item's simcluster marks, the closest mark winning per keyword.

    Raises:
        pytest.UsageError: a mark given positional arguments, or a keyword that neither a run nor a
            compare takes (naming it and the close ones).
    """
    import difflib

    out: dict = {}
    known = _run_keys() | _compare_keys()
    for mark in reversed(list(item.iter_markers("simcluster"))):
        if mark.args:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.simcluster takes keywords only, e.g. "
                                    f"@pytest.mark.simcluster(mesh='2x2x2'); got {mark.args!r}")
        for key in mark.kwargs:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=3)
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.simcluster({key}=...): no run or compare "
                                        f"takes {key!r}{'; did you mean ' + ', '.join(close) if close else ''}? "
                                        f"e.g. @pytest.mark.simcluster(mesh='2x2x2', wall_timeout_s=300)")
        out.update(mark.kwargs)
    return out


class Simcluster:
    """The ``simcluster`` fixture's value: call it to run (``simcluster(script=..., mesh=...)``),
    ``.compare(...)`` to compare two layouts; every run in its own folder under the test's tmp_path."""

    def __init__(self, tmp_path, defaults: dict, runs: list):
        self.tmp_path, self.defaults, self.runs = tmp_path, defaults, runs

    def _folder(self, kind: str) -> str:
        path = str(self.tmp_path / f"{kind}-{len(self.runs) + 1}")
        self.runs.append(path)
        return path

    def __call__(self, **kwargs):
        """``simcluster.run(**defaults, **kwargs)``: the Run (launcher/api.py); the marks' keywords that
        only compare takes (against, metric, rtol, ...) are left out; its errors as there (ConfigError)."""
        from simcluster.launcher.api import run

        run_keys = _run_keys()
        options = {"wall_timeout_s": DEFAULT_WALL_TIMEOUT_S, **{k: v for k, v in self.defaults.items()
                                                                if k in run_keys}, **kwargs}
        if options.get("run_dir") is None:
            options["run_dir"] = self._folder("run")
        else:
            self.runs.append(os.path.abspath(str(options["run_dir"])))
        return run(**options)

    run = __call__

    def compare(self, **kwargs):
        """``simcluster.compare(**defaults, **kwargs)``: the Comparison (launcher/compare.py); the
        marks' keywords that compare has no use for (wall_timeout_s, chaos, max_restarts) are left out."""
        from simcluster.launcher.compare import compare

        known = _compare_keys()
        options = {**{k: v for k, v in self.defaults.items() if k in known}, **kwargs}
        if options.get("run_dir") is None:
            options["run_dir"] = self._folder("compare")
        else:
            self.runs.append(os.path.abspath(str(options["run_dir"])))
        return compare(**options)


def _folders(path: str) -> list[str]:
    """A run folder, or a compare's base folder's run folders (each holding a compose.yml)."""
    sides = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(path, "*", "compose.yml")))
    return sides or [path]


def _teardown(path: str) -> None:
    """Remove every container and network of the run folder's compose project(s); a missing engine is fine."""
    from simcluster.launcher.docker.client import PROJECT_LABEL, Client, LauncherError
    from simcluster.launcher.docker.cluster import remove_labelled
    from simcluster.launcher.docker.handle import Handle

    for folder in _folders(path):
        try:
            remove_labelled(Client(), f"{PROJECT_LABEL}={Handle.for_run(folder).project}")
        except LauncherError:
            pass


@pytest.fixture
def simcluster(request: pytest.FixtureRequest, tmp_path, simcluster_image) -> Simcluster:
    """Run your code on a fresh simulated cluster: ``simcluster(script="train.py", mesh="2x2x2",
    args=[...])`` -> Run (ok, exit_code, summary, metrics, values(), failed, logs(), traffic,
    run_dir); ``simcluster.compare(...)`` -> Comparison. See this module's docstring."""
    runs = request.node.stash.setdefault(RUNS, [])
    try:
        yield Simcluster(tmp_path, _defaults(request.node), runs)
    finally:
        for path in runs:
            _teardown(path)


def sections(path: str):
    """(folder, text) of what a failed test's report shows of a run folder (each side of a compare):
    its summary, else its log's end."""
    from simcluster.core.runlog import log_lines, summary_lines

    for folder in _folders(path):
        lines = summary_lines(folder)
        if not lines:
            tail = log_lines(folder)[-LOG_TAIL:]
            lines = ([f"(no summary: the run did not end; the last {len(tail)} lines of its cluster.log)", *tail]
                     if tail else ["(no cluster.log: the run did not start; its error is in the test's traceback)"])
        yield folder, "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    runs = item.stash.get(RUNS, None)
    if runs and report.failed and report.when == "call":
        for i, path in enumerate(runs, 1):
            for folder, text in sections(path):
                report.sections.append((f"simcluster run {i}: {folder}", text))
    return report
