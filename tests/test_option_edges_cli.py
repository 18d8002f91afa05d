"""The new options refused at the command line's edge (issue 54, item 2): a Kubernetes value written to
arrive unchanged; --stall-s below the watch's resolution; a --metric-regex's groups, its time bound and a
non-number, an --rtol that compares nothing; an unknown flag of the launcher never handed to your code;
generate's and plan --full-size's options on the engines and programs they reach; diagnose's folder.
The job request's values: tests/test_option_edges.py.

    python -m pytest -q -n 0 tests/test_option_edges_cli.py

No Docker and no cluster: every check runs before anything is written or started.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simcluster.launcher.engines.pod import env_list
from simcluster.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "ddp.py")

def launcher(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


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
        check_options(None, regex, 1e-5)
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


def refused(capsys, argv: list[str], *named: str) -> None:
    """`launcher ARGV` in this process exits 2 with one error naming each of ``named``; no traceback, nothing printed
    on stdout (generate --stdout: no document)."""
    from simcluster.launcher.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own usage errors (a flag given twice)
        rc = e.code
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
    ([*F, "--trace-dir", ""], ["trace_dir: --trace-dir '' is empty; give one, e.g. --trace-dir runs/fullsize-traces, or "
                               "drop --trace-dir for its default"]),
    ([*F, "--python", ""], ["python: --python '' is empty"]),
    ([*F, "--python", "/bin/true"], ["python: '/bin/true' is not a Python interpreter that imports torch (exit 0"]),
    ([*F, "--ranks", "0,,1"], ["ranks: '0,,1' is not 'all' or ranks in 0..1 separated by commas; e.g. --ranks 0,1"]),
    ([*F, "--search", "--knob", "x=1,,2"], ["knob: 'x=1,,2': an empty value"]),
    ([*F, "--search", "--knob", "x y=1,2"], ["knob: 'x y=1,2': 'x y' is no flag name"]),
    ([*F, "--knob", "x=1,2"], ["got 'x=1,2' without --search"]),
    (["plan", "--full-size", "--mesh", "2x1x1", "--model", "tiny", "--stall-s", "1"], [
        "stall_s: must be 0 (off) or a finite number of seconds in [5, 1e+06]", "got 1.0",
        "(plan --full-size --mesh 2x1x1: the built-in trainer's flags)"]),
    (["generate", "--mesh", "2x1x1", "--out", ""], ["out: must be text, not empty or blank (to take the default, leave "
                                                   "--out out), got ''"]),
    ([*G, "--user", " "], ["user: must be text, not empty or blank", "e.g. user='1000:1000'"]),
    ([*G, "--code", ""], ["code: must be text, not empty or blank"]),
    (["generate", "--mesh", "2x1x1", "--trace-steps", "", "--stdout"], ["trace_steps: must be text, not empty"]),
    (["generate", "--mesh", "2x1x1", "--steps", "6", "--trace-steps", "3,3", "--stdout"],  # before: traced step 3 once
     ["trace_steps: step 3 given twice in '3,3'; e.g. 3,4 or 3-5"]),
    ([*G, "--total-steps", "6", "--trace-steps", "3,2-4"], ["trace_steps: step 3 given twice in '3,2-4'; e.g. 3,4"]),
    ([*G, "--trace-steps", "2-4,4"], ["trace_steps: step 4 given twice in '2-4,4'"]),
    ([*G, "--target", "slurm", "--user", "1000:0"], ["--user '1000:0': a slurm document has no use for it: its nodes are "
                                                    "the cluster's own", "only --target compose or swarm writes it"]),
    ([*G, "--target", "jobset", "--image", "reg.io/a:1", "--join-timeout-s", "100"], [
        "--join-timeout-s 100.0: a jobset document has no use for it"]),
    ([*G, "--target", "skypilot", "--image", "reg.io/a:1", "--mount", "/tmp:/scratch"], [
        "--mount /tmp:/scratch: a skypilot document has no use for it"]),
    ([*G, "--target", "trainjob", "--image", "reg.io/a:1", "--mount-code"], ["--mount-code: a trainjob document"]),
    ([*G, "--target", "jobset", "--image", "reg.io/a:1", "--check-devices"], [
        "--check-devices: an instrument of the rehearsal's simulated nodes, and a jobset document runs your code's ranks "
        "without them"]),
    ([*G, "--target", "skypilot", "--image", "reg.io/a:1", "--gpu-memory", "24GiB"], ["--gpu-memory: an instrument"]),
    ([*G, "--target", "slurm", "--traffic", "1"], ["--traffic 1: an instrument of the rehearsal's simulated nodes, and a "
                                                  "slurm document"]),
    ([*G, "--target", "trainjob", "--image", "reg.io/a:1", "--stall-s", "30"], [
        "--stall-s 30: a trainjob document runs your code's ranks without the instruments"]),
    (["plan", "--search", "--world-size", "7", "--model", "tiny"], [
        "search: none of the 21 meshes x schedules of 7 ranks passes preflight (most often: ", "e.g. 1x1x7 gpipe: ",
        "pick a --world-size the model and --global-batch can be spread over"]),
    ([*G, "--nodes", "2"], ["--nodes: given twice (--nodes 1, --nodes 2); argparse would keep the last and drop the first "
                            "unsaid; give it once, e.g. --nodes 2"]),
    ([*F, "--search", "--knob", "x=1,2", "--knob=y=1,2"], ["--knob: given twice (--knob x=1,2, --knob=y=1,2)"]),
    (["report", "--run-dir", ""], ["report: --run-dir '' is empty; give a run folder of `launcher up`"]),
    (["plan", "--full-size", "--mesh", "2x1x1", "--model", "tiny", "--lr", "nan"], ["lr: must be a finite number > 0, "
                                                                                   "got nan"]),
    ([*F, "--hardware", "h200"], ["plan --full-size: --hardware set the analytic plan (plan without --full-size)"]),
    ([*F, "--mesh", "2x2x2"], ["full_size: --mesh are the built-in trainer's flags, not read for your --script/--module"]),
    (["up", "--mesh", "1x1x1", "--target", "jobset", "--metric-regex", r"loss (\S+)"], [
        "metric_regex: 'loss (\\\\S+)' reads a loss your code only prints, and the built-in trainer writes its own"]),
    # issue 54 item 2, round 3: a negative value reaches its check (argparse said 'expected one argument')
    ([*G, "--gpu-memory", "-1GiB"], ["--gpu-memory: '-1GiB' is -1073741824 bytes; a device holds more than 0, e.g. "
                                     "--gpu-memory 24GiB"]),
    ([*G, "--memory-per-node", "-1g"], ["memory_per_node: '-1g' is not a size", "e.g. --memory-per-node 3g"]),
    ([*G, "--gpu-memory", "\uff12\uff14GiB"], ["--gpu-memory: '\uff12\uff14GiB' is not a size",
                                              "e.g. --gpu-memory 24GiB"]),
    ([*G, "--user", "2147483648:0"], ["user: '2147483648:0' is beyond the ids a container runs as (0 to 2147483647 "
                                      "each", "e.g. --user 1000:1000"]),
    ([*G, "--user", "\u0661\u0660\u0660\u0660:1000"], ["is not UID:GID; e.g. --user 1000:1000"]),
    (["plan", "--search", "--world-size", "99999999999", "--model", "tiny"], [
        "world_size: --world-size 99999999999 is beyond what the search walks (1 to 1048576 ranks); e.g. "
        "--world-size 8"]),
    ([*F[:4], "--nodes", "99999999999", "--nproc-per-node", "99999999999"], [
        "nodes/nproc_per_node: --nodes 99999999999 x --nproc-per-node 99999999999 is 9999999999800000000001 ranks, "
        "beyond torch's (a rank is a C int: 1 to 2147483647 ranks)"]),
    (["logs", "--tail", "-5"], ["--tail: '-5' is not 'all' or a number of lines (0 or more); e.g. --tail 100"]),
    (["chaos", "--kill", "node-0", "--wait-s", "1e300"], ["wait_s: --wait-s 1e+300 must be a number of seconds above 0 "
                                                          "and at most 1e+06; e.g. --wait-s 600"]),
    (["chaos", "--kill-host", "host-1", "--wait-s", "1e300"], ["wait_s: --wait-s 1e+300 must be a number of seconds"]),
    (["chaos", "--kill", "node-0", "--at-step", "99999999999"], [
        "at_step: --at-step 99999999999 is not a step a run reaches (steps count from 1, the first finished step, to "
        "10000000); e.g. --at-step 5"]),
    (["chaos", "--freeze", "99999999999"], ["freeze: --freeze 99999999999 is a rank no simulated cluster has (ranks 0 "
                                            "to 4095: 64 nodes of 64); e.g. --freeze 1"]),
    (["status", "--file", ""], ["--file: '' names nothing; leave --file out to act on the newest run under runs/, or "
                                "name one, e.g. --file docker-compose.yml"]),
    (["chaos", "--kill", "node-0", "--project", " "], ["--project: ' ' names nothing"]),
    (["chaos", "--kill-host", "host-1", "--run-dir", ""], ["--run-dir: '' names nothing"]),
    (["down", "--run-dir", "runs", "--file", "docker-compose.yml"], [
        "--run-dir runs and --file docker-compose.yml: give one (--run-dir: a run folder of `launcher up`, --file: a "
        "compose file you started)"]),
    (["diagnose", ""], ["diagnose: '' names no folder; give the folder of one job's dumps"]),
    ([*G, "--mount", "/tmp:/data/../app"], ["mount: '/tmp:/data/../app': DST '/data/../app' is not a plain path, and "
                                            "Docker mounts it at '/app'; write a target of yours, e.g. --mount "
                                            "/tmp:/data/tmp:ro (/app is the launcher's)"]),
    ([*G, "--mount", "/tmp:/data//x/"], ["Docker mounts it at '/data/x'; write that, e.g. --mount /tmp:/data/x:ro"]),
    ([*G, "--target", "swarm", "--inter-host-bandwidth", "100mbit"], ["there are none (no --hosts)"]),
    (["generate", "--mesh", "2x1x1", "--profile-step", "99999999999999999999", "--stdout"], [
        "profile_step: must be an int from -9223372036854775807 to 9223372036854775807 (64 bits), got "
        "99999999999999999999"]),
])
def test_the_new_options_refuse_at_the_edge(capsys, monkeypatch, argv, named):
    monkeypatch.chdir(ROOT)
    refused(capsys, argv, *named)


@pytest.mark.parametrize("files, named", [
    ({"nccl_trace_rank_0": b"garbage\n"}, "nccl_trace_rank_0: it is no pickle (it begins b'garbage\\n')"),
    ({"nccl_trace_rank_0": b'{"version": "2.4"}'}, "it is JSON, and diagnose reads the pickled dumps"),
    ({"nccl_trace_rank_0": b""}, "nccl_trace_rank_0: it is empty"),
    ({"nccl_trace_rank_0": b"x", "nccl_trace_rank_00": b"x"}, "nccl_trace_rank_0 and nccl_trace_rank_00 both name rank 0"),
    (None, "a file, not a folder"),
])
def test_diagnose_names_what_the_folder_holds(capsys, tmp_path, files, named):
    for name, data in (files or {}).items():
        (tmp_path / name).write_bytes(data)
    refused(capsys, ["diagnose", str(tmp_path) if files is not None else str(ROOT / "README.md")], named)



@pytest.mark.parametrize("text, named", [("3,3", "step 3 given twice in '3,3'; e.g. 3,4 or 3-5"),
                                         ("5-3", "'5-3' in '5-3' runs backwards; write steps as 3,4 or 3-5")])
def test_the_trainers_own_trace_steps_parser_refuses_a_repeat_and_a_backwards_range(text, named):
    """core/config.py parse_steps, which `python -m train` and torchrun's ranks read --trace-steps with (no launcher
    request in front): a repeat was dropped and 5-3 traced nothing, unsaid."""
    from simcluster.core.config import parse_steps
    from simcluster.core.errors import ConfigError

    with pytest.raises(ConfigError, match="trace_steps: " + re.escape(named)):
        parse_steps(text, 10)
    assert parse_steps("2,4-5", 10) == (2, 4, 5)
