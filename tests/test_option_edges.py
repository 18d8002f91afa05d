"""The job request's new options refused at their edge (issue 54, item 2), each kind with its neighbours:
--env keys torchrun or the interpreter own, an --env key one of our options sets, the kernel's size
limits, the values torch reads; a number a timer cannot hold; a sweep of one layout; requirements whose
markers exclude every line, a package built against another torch; a trainer option on your code's job.
The command line's refusals and the metric readers: tests/test_option_edges_cli.py.

    python -m pytest -q -n 0 tests/test_option_edges.py

No Docker and no cluster: every check runs before anything is written or started.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from simcluster.launcher.job.env import ENV_BUDGET, MAX_ARG_STRLEN
from simcluster.launcher.job.request import make_request
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "ddp.py")

def user_job(**kw):
    return make_request("up", script=SCRIPT, nodes=2, nproc_per_node=1, **kw)


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
    ("LOGLEVEL=info", r"env: LOGLEVEL='info': torch takes one of CRITICAL, ERROR, WARNING, INFO, DEBUG or NOTSET, in "
                      r"capitals \(torchrun hands it to logging.setLevel as it starts"),
    ("LOGLEVEL=10", r"env: LOGLEVEL='10': torch takes one of CRITICAL"),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT=maybe", r"env: TORCH_NCCL_DUMP_ON_TIMEOUT='maybe': torch takes 0, 1, true, false"),
    ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=10m", r"env: TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC='10m': torch takes a whole number "
                                             r"from 0 to 999999999 \(torch reads it with std::stoi"),
    ("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=99999999999", r"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC='99999999999': torch"),
])
def test_env_keys_torchrun_and_the_interpreter_own_are_refused(entry, match):
    with pytest.raises(ConfigError, match=match) as e:
        user_job(env=[entry])
    assert e.value.field == "env"


def test_env_values_the_interpreter_takes_pass():
    assert user_job(env=["PYTHONHASHSEED=0", "PYTHONFAULTHANDLER=1", "WANDB_MODE=offline"]).env == (
        "PYTHONHASHSEED=0", "PYTHONFAULTHANDLER=1", "WANDB_MODE=offline")
    assert user_job(env=["LOGLEVEL=WARNING", "TORCH_NCCL_DUMP_ON_TIMEOUT=0"]).env == ("LOGLEVEL=WARNING",
                                                                                    "TORCH_NCCL_DUMP_ON_TIMEOUT=0")


def test_env_keys_our_options_set_are_refused_with_the_option():
    with pytest.raises(ConfigError, match=r"env: TORCH_DISTRIBUTED_DEBUG='OFF' meets --check-collectives 1, which "
                                          r"sets it \(1: DETAIL\); give one"):
        user_job(env=["TORCH_DISTRIBUTED_DEBUG=OFF"], check_collectives=1)
    assert user_job(env=["TORCH_DISTRIBUTED_DEBUG=INFO"]).env == ("TORCH_DISTRIBUTED_DEBUG=INFO",)
    with pytest.raises(ConfigError, match=r"env: TORCH_FR_BUFFER_SIZE='0' turns torch's Flight Recorder off, and the "
                                          r"stall watch .* --stall-s 0"):
        user_job(env=["TORCH_FR_BUFFER_SIZE=0"])
    assert user_job(env=["TORCH_FR_BUFFER_SIZE=0"], stall_s=0).stall_s == 0
    with pytest.raises(ConfigError, match=r"env: TORCH_NCCL_TRACE_BUFFER_SIZE='0' turns torch's Flight Recorder off"):
        user_job(env=["TORCH_NCCL_TRACE_BUFFER_SIZE=0"])  # its older name, read where TORCH_FR_BUFFER_SIZE is unset
    both = user_job(env=["TORCH_NCCL_TRACE_BUFFER_SIZE=0", "TORCH_FR_BUFFER_SIZE=100"])  # torch reads the first
    assert both.env == ("TORCH_NCCL_TRACE_BUFFER_SIZE=0", "TORCH_FR_BUFFER_SIZE=100")


def test_env_beyond_the_kernels_limits_is_refused_with_the_limit():
    with pytest.raises(ConfigError, match=rf"env: BIG=\.\.\. is {MAX_ARG_STRLEN + 1} bytes, and Linux starts no process "
                                          rf"with a variable over {MAX_ARG_STRLEN} bytes \(MAX_ARG_STRLEN\)"):
        user_job(env=["BIG=" + "x" * (MAX_ARG_STRLEN - 4)])
    many = [f"V{i}=" + "x" * 100_000 for i in range(12)]
    with pytest.raises(ConfigError, match=rf"env: the --env entries take \d+ bytes, over the {ENV_BUDGET} bytes"):
        user_job(env=many)


@pytest.mark.parametrize("name, value, match", [
    ("join_timeout_s", 1e300, r"join_timeout_s: must be > 0 and <= 86400 s \(a finite number\), got 1e\+300"),
    ("wall_timeout_s", 1e300, r"wall_timeout_s: must be > 0 and <= 1e\+06 s \(a finite number\), got 1e\+300"),
    ("timeout_s", 1e300, r"timeout_s: must be > 0 and <= 1e\+06 s \(a finite number\), got 1e\+300"),
    ("wall_timeout_s", 0, r"wall_timeout_s: must be > 0 and <= 1e\+06 s"),
])
def test_a_number_a_timer_cannot_hold_is_refused_with_the_range(name, value, match):
    with pytest.raises(ConfigError, match=match):
        user_job(**{name: value})


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
