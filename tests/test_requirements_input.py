"""--requirements and --env refused at the edge, each bad kind with its own message; pip's own reason and the
line it is about; packages torch does not pin may move, a clash with what torch fixes is named.

    python -m pytest -q -n 0 tests/test_requirements_input.py

No Docker: the request's checks are pure, and the download runs the host's pip against local wheels
made here (``--no-index --find-links``), so nothing leaves the machine. Nothing is built or run: a
refused requirements file never reaches pip when pip would build or clone on the host.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from simcluster.launcher.engines.deps_image import download, new_wheels
from simcluster.launcher.job.deps import Requirements
from simcluster.launcher.job.env import env_pairs
from simcluster.launcher.job.request import make_request
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def request(tmp_path: Path, **kw):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return make_request("up", script=str(script), nodes=1, nproc_per_node=1, **kw)


def refused(tmp_path: Path, text: str, match: str, name: str = "requirements.txt") -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=match):
        request(tmp_path, requirements=str(tmp_path / name))


def test_lines_pip_would_build_or_clone_on_the_host_are_refused_before_pip(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "setup.py").write_text("raise SystemExit('built on the host')\n")
    fix = r"build its wheel yourself \(pip wheel --no-deps -w dist PROJECT\) and pass --wheel dist/"
    refused(tmp_path, "tqdm\n./proj\n", rf"line 2: './proj': a local project folder is built on the host.*{fix}")
    refused(tmp_path, "-e .\n", rf"line 1: '-e \.': an editable install \(-e\) builds the project.*{fix}")
    refused(tmp_path, "mypkg @ git+https://example.org/x/mypkg.git@v1\n", r"a VCS URL makes pip clone the repository")
    refused(tmp_path, "git+https://example.org/x/mypkg.git#egg=mypkg\n", r"a VCS URL")
    refused(tmp_path, "https://example.org/mypkg-1.0.tar.gz\n", r"a source archive is built on the host")
    refused(tmp_path, "--no-binary :all:\ntqdm\n", r"--no-binary makes pip build source distributions")
    (tmp_path / "base.txt").write_text("-e ../elsewhere\n")
    refused(tmp_path, "-r base.txt\n", r"base.txt line 1: '-e \.\./elsewhere': an editable install")  # in an include


def test_an_empty_file_includes_and_text_are_checked(tmp_path):
    refused(tmp_path, "# only a comment\n\n   \n", r"holds no requirement .* add one a line \(e\.g\. tqdm==4\.67\.1\)")
    refused(tmp_path, "--extra-index-url https://example.org/simple\n", r"holds no requirement")
    refused(tmp_path, "-r missing.txt\n", r"line 1: '-r missing.txt' includes '.*missing.txt', which is not a file")
    (tmp_path / "b.txt").write_text("tqdm\n-r requirements.txt\n")
    refused(tmp_path, "-r b.txt\n", r"b.txt line 2: '-r requirements.txt' includes .* again \(an include cycle: "
                                    r".*requirements.txt -> .*b.txt -> .*requirements.txt\)")
    (tmp_path / "blob.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    with pytest.raises(ConfigError, match=r"'.*blob.txt' is not a requirements file \(not UTF-8 text\)"):
        request(tmp_path, requirements=str(tmp_path / "blob.txt"))


def test_the_image_key_follows_included_files(tmp_path):
    (tmp_path / "base.txt").write_text("tqdm==4.67.1\n")
    (tmp_path / "requirements.txt").write_text("-r base.txt\n")
    req = Requirements(str(tmp_path / "requirements.txt"))
    first = req.tag("sha256:0")
    assert req.tag("sha256:0") == first and req.tag("sha256:1") != first
    (tmp_path / "base.txt").write_text("tqdm==4.67.0\n")
    assert req.tag("sha256:0") != first


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel (what pip download reads: its name, its METADATA's requirements)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")
        z.writestr(f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return path


@pytest.fixture()
def index(tmp_path):
    """A local find-links folder: fsspec at an old and the image's version, a package that needs the old."""
    links = tmp_path / "links"
    links.mkdir()
    wheel(links, "fsspec", "2024.6.1")
    wheel(links, "fsspec", "2026.9.0")
    wheel(links, "oldstack", "1.0", ("fsspec<=2024.6.1",))
    wheel(links, "plain", "1.0")
    return links


HELD = {"torch": "2.13.0+cpu", "fsspec": "2026.9.0", "pyyaml": "6.0.3"}
FIXED = {"torch": "torch==2.13.0+cpu", "fsspec": "fsspec>=0.8.5"}


def fetch(tmp_path: Path, text: str, fixed=FIXED) -> tuple[dict, list[str]]:
    (tmp_path / "requirements.txt").write_text(text)
    dest = tmp_path / "dest"
    dest.mkdir(exist_ok=True)
    moved = download(Requirements(str(tmp_path / "requirements.txt")), HELD, fixed, str(dest))
    return moved, new_wheels(str(dest), HELD)


def test_a_package_torch_does_not_pin_moves_and_a_clash_names_both_sides(tmp_path, index):
    opts = f"--no-index\n--find-links {index}\n"
    moved, wheels = fetch(tmp_path, opts + "oldstack\nplain\n")
    assert moved == {"fsspec": "2024.6.1"} and wheels == ["fsspec-2024.6.1-py3-none-any.whl",
                                                          "oldstack-1.0-py3-none-any.whl", "plain-1.0-py3-none-any.whl"]
    with pytest.raises(ConfigError) as e:  # had torch required fsspec>=2026.1, the old stack clashes with it
        fetch(tmp_path, opts + "oldstack\n", {**FIXED, "fsspec": "fsspec>=2026.1"})
    assert "oldstack 1.0 needs fsspec<=2024.6.1, and the image fixes fsspec>=2026.1 (torch itself requires it)" \
        in str(e.value) and "requirements.txt line 3: 'oldstack'" in str(e.value), e.value


@pytest.mark.parametrize("text, reason", [
    ("plain==1.0 --hash=sha256:" + "0" * 64 + "\n",
     r"line 3: 'plain==1\.0 --hash=sha256:0+'\): THESE PACKAGES DO NOT MATCH THE HASHES .* Expected sha256 0+ Got"),
    ('plain; python_version >> "3"\n', r"line 3: .*\): Invalid marker: 'python_version >> \"3\"', parse error at"),
])
def test_pips_own_reason_is_named_with_the_line(tmp_path, index, text, reason):
    with pytest.raises(ConfigError, match=reason) as e:
        fetch(tmp_path, f"--no-index\n--find-links {index}\n" + text)
    assert "fix its name or version" not in str(e.value) and "ERROR: Exception" not in str(e.value)


def test_an_unreachable_index_a_missing_folder_and_another_file_kind_say_so(tmp_path):
    # the index option's own line is blamed, not the requirement after it (issue 54)
    with pytest.raises(ConfigError, match=r"line 1: '--index-url http://127.0.0.1:9/simple'\): .*Connection refused.*"
                                          r"No matching distribution found for plain; fix that location"):
        fetch(tmp_path, "--index-url http://127.0.0.1:9/simple\nplain\n")
    with pytest.raises(ConfigError, match=r"line 2: '--find-links /nonexistent/wheels'\): Location '/nonexistent/wheels' "
                                          r"is ignored: it is either a non-existing path.*No matching distribution found "
                                          r"for plain; fix that location"):
        fetch(tmp_path, "--no-index\n--find-links /nonexistent/wheels\nplain\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ConfigError, match=r"pyproject.toml line 1: '\[project\]'\): Invalid requirement: '\[project\]'"):
        download(Requirements(str(tmp_path / "pyproject.toml")), HELD, FIXED, str(tmp_path))


def test_env_entries_are_checked_and_reach_every_engine_document(tmp_path):
    assert env_pairs(["WANDB_MODE=offline", "EMPTY=", "X=a=b"]) == (("WANDB_MODE", "offline"), ("EMPTY", ""),
                                                                     ("X", "a=b"))
    for entry, match in [("WANDB_MODE", r"'WANDB_MODE' has no '='; give KEY=VALUE, e\.g\. --env WANDB_MODE=offline"),
                         ("1X=2", r"'1X' \(in '1X=2'\) is not a variable name"),
                         ("RANK=3", r"RANK is set by the cluster \(torchrun\) on every rank; drop it from --env"),
                         ("MASTER_ADDR=h", r"MASTER_ADDR is set by the cluster \(the rendezvous\)"),
                         ("SIMCLUSTER_GPU=x", r"SIMCLUSTER_GPU is set by the cluster \(the launcher's own options\)"),
                         ("PYTHONPATH=/x", r"PYTHONPATH is set by the cluster \(the node wrapper")]:
        with pytest.raises(ConfigError, match=match) as e:
            request(tmp_path, env=[entry])
        assert e.value.field == "env"
    with pytest.raises(ConfigError, match=r"A is given twice \(A='1' and 'A=2'\); give it once"):
        request(tmp_path, env=["A=1", "A=2"])
    with pytest.raises(ConfigError, match=r"env: must be a list of text"):
        request(tmp_path, env={"A": "1"})
    out = subprocess.run([sys.executable, "-m", "launcher", "generate", "--mesh", "1x1x1", "--script",
                          "examples/ddp.py", "--env", "WANDB_MODE=offline", "--env", "HF_HUB_OFFLINE=1", "--stdout"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "--env WANDB_MODE=offline --env HF_HUB_OFFLINE=1" in out.splitlines()[1]
    assert "      WANDB_MODE: offline\n" in out and "      HF_HUB_OFFLINE: '1'\n" in out
    bad = subprocess.run([sys.executable, "-m", "launcher", "up", "--nodes", "1", "--nproc-per-node", "1", "--script",
                          "examples/ddp.py", "--env", "WORLD_SIZE=2"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "env: WORLD_SIZE is set by the cluster (torchrun)" in bad.stderr, bad.stderr


def test_generate_for_kubernetes_refuses_requirements_before_building(tmp_path):
    (tmp_path / "requirements.txt").write_text("tqdm\n")
    for target in ("jobset", "trainjob"):
        out = subprocess.run([sys.executable, "-m", "launcher", "generate", "--target", target, "--image",
                              "registry.example.org/me/trainer:1", "--mesh", "1x1x1", "--script", "examples/ddp.py",
                              "--requirements", str(tmp_path / "requirements.txt"), "--stdout"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
        assert f"--requirements: the image it derives lives in this machine's Docker only, and a {target} job" \
            in out.stderr and "requirements: downloading" not in out.stderr, out.stderr
