"""The new options refused at their edge (issue 54, item 2), each kind with its neighbours: --env keys
torchrun or the interpreter own, an --env key one of our options sets, a Kubernetes value, the kernel's
size limits; --stall-s below the watch's resolution; a number a timer cannot hold; a --metric-regex's
groups, its time bound and a non-number; a sweep of one layout; requirements whose markers exclude every
line, a package built against another torch; an unknown flag of the launcher never handed to your code.

    python -m pytest -q -n 0 tests/test_option_edges.py

No Docker and no cluster: every check runs before anything is written or started.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from simcluster.launcher.engines.pod import env_list
from simcluster.launcher.job.env import ENV_BUDGET, MAX_ARG_STRLEN
from simcluster.launcher.job.request import make_request
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "ddp.py")


def user_job(**kw):
    return make_request("up", script=SCRIPT, nodes=2, nproc_per_node=1, **kw)


def launcher(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("entry, match", [
    ("PET_NPROC_PER_NODE=8", r"env: PET_NPROC_PER_NODE is set by the cluster \(torchrun \(it reads PET_NAME as its "
                             r"option --name\)\) on every rank; drop it from --env"),
    ("PYTHONHOME=/usr", r"env: PYTHONHOME is set by the cluster \(the image's interpreter \(another home: the node "
                        r"wrapper cannot start\)\)"),
    ("PYTHONSAFEPATH=1", r"env: PYTHONSAFEPATH is set by the cluster \(the node wrapper \(it imports simcluster"),
    ("PYTHONPLATLIBDIR=lib64", r"env: PYTHONPLATLIBDIR is set by the cluster"),
    ("TORCHELASTIC_MAX_RESTARTS=3", r"env: TORCHELASTIC_MAX_RESTARTS is set by the cluster \(torchrun\)"),
    ("PYTHONHASHSEED=abc", r"env: the interpreter refuses PYTHONHASHSEED='abc': .*PYTHONHASHSEED.*; fix the value"),
    ("PYTHONIOENCODING=bogus", r"env: the interpreter refuses PYTHONIOENCODING='bogus': .*; fix the value"),
    ("PYTHONWARNINGS=bogus", r"env: the interpreter refuses PYTHONWARNINGS='bogus': Invalid -W option ignored"),
    ("TORCH_FR_BUFFER_SIZE=abc", r"env: TORCH_FR_BUFFER_SIZE='abc': torch takes a whole number of entries from 0 to "
                                 r"999999 \(torch reads it with std::stoi: a non-number .* aborts every rank"),
    ("TORCH_FR_BUFFER_SIZE=99999999999", r"TORCH_FR_BUFFER_SIZE='99999999999': torch takes a whole number"),
    ("TORCH_GLOO_LAZY_INIT=on", r"env: TORCH_GLOO_LAZY_INIT='on': torch takes 0, 1, true, false, yes, no, y or n"),
    ("TORCH_DISTRIBUTED_DEBUG=", r"env: TORCH_DISTRIBUTED_DEBUG='': torch takes OFF, INFO or DETAIL"),
])
def test_env_keys_torchrun_and_the_interpreter_own_are_refused(entry, match):
    with pytest.raises(ConfigError, match=match) as e:
        user_job(env=[entry])
    assert e.value.field == "env"


def test_env_values_the_interpreter_takes_pass():
    assert user_job(env=["PYTHONHASHSEED=0", "PYTHONFAULTHANDLER=1", "WANDB_MODE=offline"]).env == (
        "PYTHONHASHSEED=0", "PYTHONFAULTHANDLER=1", "WANDB_MODE=offline")


def test_env_keys_our_options_set_are_refused_with_the_option():
    with pytest.raises(ConfigError, match=r"env: TORCH_DISTRIBUTED_DEBUG='OFF' meets --check-collectives 1, which "
                                          r"sets it \(1: DETAIL\); give one"):
        user_job(env=["TORCH_DISTRIBUTED_DEBUG=OFF"], check_collectives=1)
    assert user_job(env=["TORCH_DISTRIBUTED_DEBUG=INFO"]).env == ("TORCH_DISTRIBUTED_DEBUG=INFO",)
    with pytest.raises(ConfigError, match=r"env: TORCH_FR_BUFFER_SIZE='0' turns torch's Flight Recorder off, and the "
                                          r"stall watch .* --stall-s 0"):
        user_job(env=["TORCH_FR_BUFFER_SIZE=0"])
    assert user_job(env=["TORCH_FR_BUFFER_SIZE=0"], stall_s=0).stall_s == 0


def test_env_beyond_the_kernels_limits_is_refused_with_the_limit():
    with pytest.raises(ConfigError, match=rf"env: BIG=\.\.\. is {MAX_ARG_STRLEN + 1} bytes, and Linux starts no process "
                                          rf"with a variable over {MAX_ARG_STRLEN} bytes \(MAX_ARG_STRLEN\)"):
        user_job(env=["BIG=" + "x" * (MAX_ARG_STRLEN - 4)])
    many = [f"V{i}=" + "x" * 100_000 for i in range(12)]
    with pytest.raises(ConfigError, match=rf"env: the --env entries take \d+ bytes, over the {ENV_BUDGET} bytes"):
        user_job(env=many)


def test_a_value_kubernetes_expands_is_written_to_arrive_unchanged():
    assert env_list({"NOTE": "$(HOME) $$ $x"}) == [{"name": "NOTE", "value": "$$(HOME) $$$ $x"}]  # the kubelet reads $$ as $
    for target in ("jobset", "trainjob"):
        out = launcher("generate", "--target", target, "--image", "registry.example.org/me/t:1", "--nodes", "1",
                       "--nproc-per-node", "1", "--module", "mypkg.train", "--env", "NOTE=$(HOME)", "--stdout")
        assert out.returncode == 0, out.stderr
        assert "name: NOTE\n" in out.stdout and "value: $$(HOME)\n" in out.stdout, (target, out.stdout)


def test_stall_s_below_the_watchs_resolution_is_refused():
    from simcluster.core.preflight_values import STALL_MIN_S
    from simcluster.train.stallwatch import POLL_S

    assert STALL_MIN_S >= 3 * POLL_S  # published and looked at once a POLL_S each: seen up to 2 POLL_S late
    out = launcher("generate", "--nodes", "2", "--nproc-per-node", "1", "--script", "examples/ddp.py",
                   "--stall-s", "0.5", "--stdout")
    assert out.returncode == 2 and out.stdout == ""
    assert "error: --stall-s: must be 0 (off) or a finite number of seconds in [5, 1e+06] (below 5 s the watch" \
        in out.stderr and "got 0.5" in out.stderr, out.stderr
    assert launcher("generate", "--mesh", "2x1x1", "--stall-s", "0.001", "--stdout").returncode == 2


@pytest.mark.parametrize("name, value, match", [
    ("join_timeout_s", 1e300, r"join_timeout_s: must be > 0 and <= 86400 s \(a finite number\), got 1e\+300"),
    ("wall_timeout_s", 1e300, r"wall_timeout_s: must be > 0 and <= 1e\+06 s \(a finite number\), got 1e\+300"),
    ("timeout_s", 1e300, r"timeout_s: must be > 0 and <= 1e\+06 s \(a finite number\), got 1e\+300"),
    ("wall_timeout_s", 0, r"wall_timeout_s: must be > 0 and <= 1e\+06 s"),
])
def test_a_number_a_timer_cannot_hold_is_refused_with_the_range(name, value, match):
    with pytest.raises(ConfigError, match=match):
        user_job(**{name: value})


@pytest.mark.parametrize("regex, match", [
    (r"(?P<value>\S+) (\d+)", r"has 2 group\(s\) named value; give one group, the value .* and no other"),
    (r"(?P<step>\d+) (?P<value>\S+) (?P<rate>\S+)", r"has 3 group\(s\) named rate, step, value"),
    (r"(?P<step>\d+)", r"has 1 group\(s\) named step"),
    (r"(\d+)+x", r"tried on a long line, still ran after 2 s: the pattern backtracks"),
    (r"(a|a)*b", r"still ran after 2 s: the pattern backtracks"),
    (r"(\d*)", r"matches an empty line, so every line the ranks print would be a step with an empty value"),
    (r"(?P<value>[0-9.]+)?", r"matches an empty line"),
    (r"loss (", r"is not a regular expression: missing \), .*; e\.g\. 'loss \(\[0-9\.eE\+-\]\+\)'"),
])
def test_a_metric_regex_of_other_groups_or_that_backtracks_is_refused(regex, match):
    from simcluster.launcher.compare_read import check_options

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=match):
        check_options("loss", regex, 1e-5)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("rtol", [1e300, 2.0, float("inf"), float("nan"), -1e-5])
def test_an_rtol_that_compares_nothing_is_refused(rtol):
    from simcluster.launcher.compare_read import check_options

    with pytest.raises(ConfigError, match=r"--rtol: must be a finite number in \[0, 1\] \(the largest relative "
                                          r"difference allowed; beyond 1 a value of another sign passes"):
        check_options("loss", None, rtol)
    check_options("loss", None, 1.0)


def test_a_metric_regex_that_matches_a_non_number_says_so(tmp_path):
    from simcluster.launcher.observe.summary_record import final_metrics
    from simcluster.core.runlog import printed_series

    (tmp_path / "cluster.log").write_text("node-0 r0     | step 1 loss 2.5,\nnode-0 r0     | step 2 loss 2.25,\n")
    assert printed_series(str(tmp_path), r"loss ([0-9.]+)") == (0, [(1, 2.5), (2, 2.25)])
    with pytest.raises(ValueError, match=r"matched 'step 1 loss 2\.5,', but its step '1' or value '2\.5,' is not a "
                                         r"number; make the value group match a number only"):
        printed_series(str(tmp_path), r"loss (\S+)")
    m = final_metrics(str(tmp_path), {}, 0.0, r"loss (\S+)")
    assert m["final_loss"] is None and "value '2.5,' is not a number" in m["printed_error"]
    assert final_metrics(str(tmp_path), {}, 0.0)["final_loss"] == 2.25  # the common formats read it


def test_a_sweep_of_one_layout_or_of_layouts_too_large_is_refused():
    from simcluster.launcher.sweep import plan

    with pytest.raises(ConfigError, match=r"sweep: a job of 1 rank has one layout \(1 node x 1 rank\), so there is "
                                          r"nothing to compare it with"):
        plan(make_request("up", script=SCRIPT, nodes=1, nproc_per_node=1))
    with pytest.raises(ConfigError, match=r"sweep: a job of 1 rank has one layout"):
        plan(make_request("up", mesh="1x1x1", model="tiny"))
    with pytest.raises(ConfigError) as e:
        plan(make_request("up", script=SCRIPT, nodes=2, nproc_per_node=64))
    assert "a simulated cluster holds at most 64 ranks a node and 64 nodes" in str(e.value)
    assert "nproc_per_node=128" not in str(e.value) and "--nproc-per-node 128" not in str(e.value)


def test_requirements_whose_markers_exclude_every_line_are_refused(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text('tqdm==4.67.1; python_version < "3.8"\npywin32==306; sys_platform == "win32"\n')
    with pytest.raises(ConfigError, match=r"every requirement of .* has a marker that excludes the image's Python "
                                          r"\(CPython 3\.11, Linux x86-64\), e\.g\. .* line 1: 'tqdm==4\.67\.1; "
                                          r"python_version < \"3\.8\"', so nothing would be installed"):
        user_job(requirements=str(req))
    req.write_text('tqdm==4.67.1; python_version >= "3.10"\npywin32==306; sys_platform == "win32"\n')
    assert user_job(requirements=str(req)).requirements == str(req)


def test_a_package_built_against_another_torch_is_refused_naming_both():
    from simcluster.launcher.engines.deps_image import torch_builds
    from simcluster.launcher.job.deps import Line

    held = {"torch": "2.13.0+cpu"}
    lines = (Line("requirements.txt", 1, "torchvision"),)
    with pytest.raises(ConfigError, match=r"requirements: torchvision 0\.28\.0 \(requirements\.txt line 1: "
                                          r"'torchvision'\) is PyPI's build, against a CUDA torch, and the image's "
                                          r"torch is 2\.13\.0\+cpu: .* --extra-index-url https://download\.pytorch\.org"
                                          r"/whl/cpu .* pin torchvision==0\.28\.0\+cpu"):
        torch_builds({"torchvision": "0.28.0", "tqdm": "4.67.1"}, held, lines)
    with pytest.raises(ConfigError, match=r"torchaudio 2\.13\.0\+cu128 is its cu128 build, and the image's torch is "
                                          r"2\.13\.0\+cpu"):
        torch_builds({"torchaudio": "2.13.0+cu128"}, held, ())
    torch_builds({"torchvision": "0.28.0+cpu", "tqdm": "4.67.1"}, held, lines)  # the image's build: taken


def test_an_unknown_flag_of_the_launcher_is_never_handed_to_your_code():
    out = launcher("up", "--script", "examples/ddp.py", "--nodes", "2", "--nproc-per-node", "1", "--against", "2x2x1",
                   "--myflag", "3")
    assert out.returncode == 2
    assert "--against: an option of `compare`" in out.stderr and "-- --against" not in out.stderr, out.stderr
    assert "your code's arguments go after --, e.g. ... -- --myflag 3" in out.stderr and "-- 2x2x1" not in out.stderr
    out = launcher("compare", "--script", "examples/ddp.py", "--nodes", "2", "--nproc-per-node", "1", "--against",
                   "2x1x1", "--nprocs-per-node", "2")  # a typo, not a prefix (argparse takes a prefix)
    assert out.returncode == 2 and "--nprocs-per-node: no option of compare; did you mean --nproc-per-node or" in \
        out.stderr and "-- --nprocs-per-node" not in out.stderr, out.stderr


def test_the_derived_images_resolution_names_what_it_held(tmp_path):
    import zipfile

    from simcluster.launcher.engines.deps_image import held_for, held_text

    def wheel(name: str, version: str, requires: tuple[str, ...]) -> str:
        path = tmp_path / f"{name}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: "
                       f"{version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
        return path.name

    added = [wheel("datasets", "2.0.0", ("fsspec[http]>=2021.05.0", "numpy>=1.17", "tqdm", 'pytest; extra == "test"')),
             wheel("tqdm", "4.67.1", ())]
    held = {"torch": "2.13.0+cpu", "fsspec": "2026.9.0", "numpy": "2.4.6", "pytest": "9.0.3"}
    kept = held_for(str(tmp_path), added, held, {})
    assert kept == {"fsspec": ["datasets 2.0.0"], "numpy": ["datasets 2.0.0"]}
    assert held_text(kept, held) == "fsspec 2026.9.0 (for datasets 2.0.0), numpy 2.4.6 (for datasets 2.0.0)"
    assert held_for(str(tmp_path), added, held, {"fsspec": "2024.6.1"}) == {"numpy": ["datasets 2.0.0"]}


def test_a_trainer_option_on_your_codes_job_is_answered_in_the_values_typed():
    with pytest.raises(ConfigError) as e:
        user_job(steps=3, seed=4)
    assert str(e.value) == ("--steps, --seed: options of the built-in trainer, not of your code; where your code takes "
                            "them, pass them after --, e.g. ... -- --steps 3 --seed 4; your code's step count for the "
                            "progress line is --total-steps 3")


def refused(capsys, argv: list[str], *named: str) -> None:
    """`launcher ARGV` in this process exits 2 with one error naming each of ``named``; no traceback, nothing printed
    on stdout (generate --stdout: no document)."""
    from simcluster.launcher.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err and "error: " in err, (rc, out, err)
    for word in named:
        assert word in err, (word, err)


G = ["generate", "--nodes", "1", "--nproc-per-node", "1", "--module", "mypkg.train", "--stdout"]
F = ["plan", "--full-size", "--script", SCRIPT, "--nodes", "1", "--nproc-per-node", "2"]


@pytest.mark.parametrize("argv, named", [
    ([*G, "--target", "jobset", "--image", "reg.io/a:1", "--pyxis"], ["--pyxis: a jobset document has no use for it, "
                                                                     "only --target slurm writes it; drop it"]),
    ([*G, "--container-image", "reg.io/a:1"], ["--container-image 'reg.io/a:1': a compose document has no use"]),
    ([*G, "--workdir", "/x"], ["--workdir '/x': a compose document", "only --target slurm or swarm writes it"]),
    ([*G, "--target", "jobset", "--image", "reg.io/a:1", "--setup", "x"], ["only --target slurm or skypilot"]),
    ([*G, "--target", "jobset", "--push", "localhost:70000"], ["push: 'localhost:70000' names port 70000, and a TCP "
                                                               "port is 1 to 65535"]),
    ([*G, "--target", "jobset", "--push", "reg.io:0/me"], ["names port 0"]),
    ([*G, "--target", "jobset", "--push", "reg.io/-me"], ["push: 'reg.io/-me' is not a registry"]),
    ([*G, "--target", "slurm", "--container-image", "http://x/y"], ["container_image: 'http://x/y' has a scheme"]),
    (["generate", "--mesh", "1x1x1", "--out", "/proc/simcluster/x.yml"], ["out: /proc/simcluster/x.yml cannot be "
                                                                          "written (No such file or directory)"]),
    ([*G, "--gpu-memory", "24"], ["--gpu-memory: '24' is 24 bytes (a number without a unit counts bytes), below 1 MiB",
                                  "e.g. --gpu-memory 24GiB"]),
    ([*G, "--gpu-memory", "1e400GB"], ["'1e400GB' is over 10^409 bytes, above the --gpu h100-sxm model's"]),
    (["generate", "--mesh", "2x1x1", "--gpu-memory", "24GiB", "--stdout"], [
        "--gpu-memory 24GiB: an option of your own code's runs; the built-in trainer runs on --device cpu or cuda"]),
    ([*F[:4], "--nodes", "0"], ["nodes/nproc_per_node: must be >= 1, got --nodes 0"]),
    ([*F[:3], "examples", *F[4:]], ["script: 'examples' is a folder; give a Python file"]),
    ([*F[:3], "README.md", *F[4:]], ["script: 'README.md' is not a .py file"]),
    ([*F[:2], "--module", "no_such_pkg.train", *F[4:]], ["module: 'no_such_pkg.train' cannot be imported by this "
                                                         "interpreter", "No module named 'no_such_pkg'"]),
    ([*F[:2], "--module", "bad name", *F[4:]], ["module: 'bad name' is not a dotted module name"]),
    ([*F, "--ranks", "1,1"], ["ranks: '1,1' names a rank twice"]),
    ([*F, "--search", "--knob", "x=4,2,1"], ["knob: 'x=4,2,1'", "in increasing order; e.g. --knob x=1,2,4"]),
    ([*F, "--trace-dir", "README.md/traces"], ["trace_dir: 'README.md/traces' cannot be made a folder"]),
    ([*F, "--hardware", "h200"], ["plan --full-size: --hardware set the analytic plan (plan without --full-size)"]),
    ([*F, "--mesh", "2x2x2"], ["full_size: --mesh are the built-in trainer's flags, not read for your --script/--module"]),
    (["up", "--mesh", "1x1x1", "--target", "jobset", "--metric-regex", r"loss (\S+)"], [
        "metric_regex: 'loss (\\\\S+)' reads a loss your code only prints, and the built-in trainer writes its own"]),
])
def test_the_new_options_refuse_at_the_edge(capsys, monkeypatch, argv, named):
    monkeypatch.chdir(ROOT)
    refused(capsys, argv, *named)


@pytest.mark.parametrize("files, named", [
    ({"nccl_trace_rank_0": b"garbage\n"}, "nccl_trace_rank_0: it is no pickle (it begins b'garbage\\n')"),
    ({"nccl_trace_rank_0": b'{"version": "2.4"}'}, "it is JSON, and diagnose reads the pickled dumps"),
    ({"nccl_trace_rank_0": b""}, "nccl_trace_rank_0: it is empty"),
    ({"nccl_trace_rank_0": b"x", "nccl_trace_rank_00": b"x"}, "nccl_trace_rank_0 and nccl_trace_rank_00 both name rank 0"),
    (None, "a file, not folder"),
])
def test_diagnose_names_what_the_folder_holds(capsys, tmp_path, files, named):
    for name, data in (files or {}).items():
        (tmp_path / name).write_bytes(data)
    refused(capsys, ["diagnose", str(tmp_path) if files is not None else str(ROOT / "README.md")], named)
