"""The launcher resolves once at the edge: one mesh parse and one compose build per `generate`,
no import cycle, the Docker SDK instead of parsing `docker` output, one run_dir rule, `$`
escaped, and bad input refused before anything is written. No Docker, no torch.

    python -m pytest -q tests/test_launcher_edge.py
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

import simcluster.launcher.cli
import simcluster.launcher.engines.compose.render
import simcluster.core.config
from simcluster.launcher.job import files

ROOT = Path(__file__).resolve().parent.parent


def calls_during(funcs, fn) -> dict[str, int]:
    """How often each of funcs ran (by code object, however it was imported) while fn ran."""
    codes = {f.__code__: f.__name__ for f in funcs}
    counts = dict.fromkeys(codes.values(), 0)

    def profile(frame, event, _arg):
        if event == "call" and frame.f_code in codes:
            counts[codes[frame.f_code]] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


def test_generate_parses_the_mesh_once_and_builds_once(tmp_path, capsys):
    out = tmp_path / "c.yml"
    counts = calls_during([simcluster.core.config.parse_mesh, simcluster.launcher.engines.compose.render.build_compose],
                          lambda: simcluster.launcher.cli.main(["generate", "--mesh", "pp=2,dp=2,tp=2", "--model", "tiny",
                                                     "--out", str(out)]))
    assert counts == {"parse_mesh": 1, "build_compose": 1}
    assert out.is_file()


def _imports(path: Path) -> set[str]:
    """simcluster.launcher.* modules a file imports (module level and inside functions), named
    launcher.*; a bare ``launcher`` or ``train`` import fails the test (a user's folder would shadow it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            assert name.split(".")[0] not in ("launcher", "train"), f"{path}: import {name} (use simcluster.{name})"
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("simcluster.launcher"):
            mod = node.module.removeprefix("simcluster.")
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("simcluster.") for a in node.names if a.name.startswith("simcluster.launcher"))
    return found


def test_launcher_import_graph_has_no_cycle():
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts): p for p in (ROOT / "launcher").rglob("*.py")}
    modules = {m.removesuffix(".__init__"): p for m, p in modules.items()}
    graph = {m: sorted(i for i in _imports(p) if i in modules and i != m) for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path + [m, n])
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
    importers = {m for m, deps in graph.items() if "launcher.cli" in deps}
    assert importers == {"launcher.__main__"}  # nobody else imports the door (simcluster/__main__.py too)


# What only launcher/docker/ (client.py, container.py, images.py, cluster.py, hosts.py) may do with the Docker SDK
# (test_docker_through_the_sdk_only).
SDK_METHODS = {"exec_run", "unpause", "pause", "tasks", "connect", "disconnect", "reload"}  # obj.NAME(...)
SDK_METHODS_WITH = {"remove": "force", "stop": "timeout", "wait": "timeout"}  # obj.NAME(KEYWORD=...): a common name
SDK_COLLECTIONS = {"swarm", "networks", "containers", "images", "services", "volumes", "configs", "secrets"}  # x.NAME.y


def sdk_uses(tree: ast.AST) -> list[str]:
    """What a module does with the SDK that only launcher/docker/ may: import docker, call ``client()``,
    reach an SDK client (``Client.sdk()``, ``.sdks()``, ``sdk_client()``), call a method of an SDK object
    (SDK_METHODS, SDK_METHODS_WITH; a function of launcher/docker/container.py of that name, called by
    its bare name, is fine) or a client's collection
    (``client().containers.list``)."""
    found = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] == "docker"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "docker":
            found.append(f"{where}: from {node.module} import")
        elif isinstance(node, ast.Attribute) and node.attr in ("sdk", "sdks"):
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in SDK_COLLECTIONS:
            found.append(f"{where}: .{node.value.attr}.{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            keywords = {k.arg for k in node.keywords}
            if name in ("client", "sdk_client"):
                found.append(f"{where}: {name}()")
            elif isinstance(func, ast.Attribute) and (
                    name in SDK_METHODS or name in SDK_METHODS_WITH and SDK_METHODS_WITH[name] in keywords):
                found.append(f"{where}: .{name}(")
    return sorted(found, key=lambda f: int(f.split()[1].rstrip(":")))


def test_sdk_uses_are_seen():
    """The guard below sees each kind of SDK use that once leaked out of launcher/docker/, and none of
    its own functions or the standard library's look-alikes."""
    leaks = ["import docker", "from docker.errors import NotFound", "Client().sdk().info()", "dc = client()",
             "for _, c in Client(hosts).sdks(): pass", "sdk_client(None)",
             "client().swarm.init(advertise_addr='127.0.0.1')", "dc.swarm.leave(force=True)", "dc.services.list()",
             "svc.tasks()", "dc.networks.get('n').remove()", "dc.containers.get(cid)", "dc.images.build(path='.')",
             "c.exec_run(['true'])", "c.unpause()", "c.pause()", "c.reload()", "c.remove(force=True)",
             "c.stop(timeout=10)", "c.wait(timeout=600)", "net.connect(c, aliases=['a'])", "net.disconnect(c)",
             "try:\n    pass\nexcept docker.errors.APIError:\n    pass\nimport docker"]
    for leak in leaks:
        assert sdk_uses(ast.parse(leak)), leak
    fine = ["unpause(c)", "disconnect(c)", "Client().containers('p')", "client.exit_code(c)", "exec_in(c, ['true'])",
            "remove(c)", "stop(c, 10)", "cluster.attach(client, 'n', c, ['a'])", "Client(hosts).silent_hosts()", "proc.wait()", "proc.kill()", "os.remove(path)",
            "names.remove('x')", "halt.wait(1.0)", "runner.logs(target, [], follow=True, tail='all')",
            "text.replace(**kw)", "launch.node.image"]
    for ok in fine:
        assert not sdk_uses(ast.parse(ok)), ok


def test_docker_through_the_sdk_only():
    """launcher/docker/ (client.py, container.py, images.py, cluster.py, hosts.py) alone touches the Docker SDK,
    its compose_cli.py alone runs `docker stack` (tests' helpers are exempt)."""
    floor = ROOT / "launcher" / "docker"
    sdk_homes = {floor / name for name in ("client.py", "container.py", "images.py", "cluster.py", "hosts.py")}
    sources = {p: p.read_text() for folder in ("launcher", "bench") for p in (ROOT / folder).rglob("*.py")}
    for home in sdk_homes:
        assert "import docker" in sources[home] or ".sdk()" in sources[home] or "container." in sources[home]
        assert sdk_uses(ast.parse(sources[home]))
    for path, text in sources.items():
        if path not in sdk_homes:
            assert not sdk_uses(ast.parse(text)), f"{path.relative_to(ROOT)} touches the Docker SDK (only " \
                                                  f"launcher/docker/ may): " \
                                                  f"{sdk_uses(ast.parse(text))}"
        # the CLIs without an SDK: compose (v2), and `docker stack` (deploy, rm) in compose_cli.stack_cli only
        allowed = "compose|stack" if path == floor / "compose_cli.py" else "compose"
        assert not re.search(rf"""\[["']docker["'],(?!\s*["']({allowed})["'])""", text), f"{path} runs the docker CLI"
        assert "yaml.safe_load" not in text, f"{path} parses a YAML file"


def test_shared_facts_have_one_home():
    """Node names, the lost-after fraction and the store keys are written in launcher/container/layout.py only."""
    for path in (ROOT / "launcher").rglob("*.py"):
        if path.name == "layout.py":
            continue
        text = path.read_text()
        store_key = re.search(r'"simcluster/(reported|exit|node|hb|verdict|finished)', text)
        assert 'f"node-{' not in text and "0.4" not in text and not store_key, path


def test_explicit_run_dir_wins_and_dollar_is_escaped(tmp_path):
    def gen(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "launcher", "generate", *args, "--stdout"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    node = yaml.safe_load(gen("--mesh", "2x1x1", "--run-dir", "runs/local"))["services"]["node-0"]
    assert node["volumes"] == ["../runs/local:/runs/local:rw"]
    assert node["command"][-2:] == ["--run-dir", "/runs/local"]
    text = gen("--mesh", "2x1x1", "--run-dir", "runs/a$b")
    node = yaml.safe_load(text)["services"]["node-0"]
    assert node["volumes"] == ["../runs/a$$b:/runs/a$$b:rw"]  # Compose reads $$ as a literal $
    body = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    assert "$b" not in body.replace("$$b", "")
    assert "mkdir -p 'runs/a$b'" in text  # the header's shell line quotes it


def test_start_late_for_an_unknown_node_writes_nothing(tmp_path):
    run = tmp_path / "never"
    proc = subprocess.run([sys.executable, "-m", "launcher", "up", "--mesh", "2x1x1", "--model", "tiny",
                           "--start-late", "node-7=5", "--run-dir", str(run)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--start-late: no node node-7 in mesh 2x1x1; nodes are node-0, node-1" in proc.stderr
    assert not run.exists()


def test_containers_run_as_the_invoking_user(monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    monkeypatch.setattr(os, "getgid", lambda: 99)
    assert files.container_user() == "1234:99"
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert files.container_user() == "1000:1000"  # root: the image's own user
    doc = yaml.safe_load(subprocess.run([sys.executable, "-m", "launcher", "generate", "--mesh", "1x1x1",
                                         "--user", "1234:99", "--stdout"], cwd=ROOT, capture_output=True,
                                        text=True, timeout=120).stdout)
    assert {svc["user"] for svc in doc["services"].values()} == {"1234:99"}


def test_bad_user_code_inputs_exit_2_and_write_nothing(tmp_path):
    """A missing script, module or mount source, trainer flags on a script, a code folder the
    containers' user cannot read: exit 2, each named with its fix, no file written."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "t.py").write_text("")
    (tmp_path / "code").mkdir()
    out = tmp_path / "out.yml"
    cases = [
        (["--mesh", "2x2x2", "--script", str(tmp_path / "nope.py")], "script: " + str(tmp_path / "nope.py") + " does not exist"),
        (["--nodes", "2", "--nproc-per-node", "1", "--code", str(tmp_path / "code"), "--module", "mypkg.train"],
         "module: mypkg.train not found in --code"),
        (["--nodes", "1", "--nproc-per-node", "1", "--script", str(ROOT / "examples" / "ddp.py"), "--mount",
          str(tmp_path / "missing") + ":/data/x"], "mount: source " + str(tmp_path / "missing") + " does not exist"),
        (["--mesh", "2x2x2", "--script", str(ROOT / "examples" / "ddp.py"), "--model", "tiny", "--steps", "3"],
         "--model, --steps: options of the built-in trainer, not of your code"),
        (["--nodes", "2", "--script", str(ROOT / "examples" / "ddp.py")], "shape: --nodes and --nproc-per-node"),
        (["--mesh", "2x2x2", "--nodes", "2", "--nproc-per-node", "1", "--script", str(ROOT / "examples" / "ddp.py")],
         "shape: give either --mesh"),
        (["--nodes", "1", "--nproc-per-node", "1", "--script", str(private / "t.py"), "--user", "4321:4321"],
         f"code: {private} is not readable by the containers' user 4321:4321"),
        (["--mesh", "2x1x1", "--nodes", "3"], "the built-in trainer takes --mesh and its own flags"),
        (["--nodes", "1", "--nproc-per-node", "1", "--script", str(ROOT / "examples" / "ddp.py"), "--mount",
          str(tmp_path / "code") + ":/data/x", "--user", "me"], "user: 'me' is not UID:GID"),
    ]
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "launcher", "generate", *args, "--out", str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and not out.exists()
