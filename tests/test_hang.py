"""The stall watch: a hang named within seconds, on the host and on the cluster.

    python -m pytest -q tests/test_hang.py

The diagnosis of each kind of hang from the records real runs left (tests/data/hang/KIND.json:
hang.json of ``torchrun --nproc-per-node 4 examples/hang.py --kind KIND`` with the instruments and
``SIMCLUSTER_STALL_S=5``; regenerate with that command if the record's format changes); torch's
DETAIL mismatch message named on both sides; --stall-s's bad input, and one above the timeout raising
it; the watch's verdict from the ranks' published states (a hang only while a rank waits in
communication, counted from the later of the last progress and the wait's start; else a note) and a
compile under way told from compiled code running; one real run of every part on the host (torchrun, 4 ranks, a rank busy in Python), ranks all
outside communication past the limit (a note, no hang) and one on the cluster (``simcluster.run``, a
2x2x2 mesh, a pipeline stage one microbatch short: Run.hang, exit 4, stacks, `launcher report`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import need_torch

from simcluster.launcher.instrument.spec import Instruments
from simcluster.core.hang_diagnosis import diagnose, fingerprint_mismatch

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "hang"
BOOT = ROOT / "launcher" / "instrument" / "boot"

EXPECTED = {
    "skip": "HANG at step 3 after 5 s: ranks 0, 2, 3 wait in all_reduce #3 of group [0, 1, 2, 3] (hang.py:64); "
            "rank 1 never entered it, it waits in recv #1 from rank 0 (hang.py:59)",
    "recv-first": "HANG at step 3 after 5 s: ranks 0 and 1 both receive first: rank 0 waits in recv #1 from rank 1 "
                  "(hang.py:56), rank 1 in recv #1 from rank 0 (hang.py:56); neither sends",
    "microbatch": "HANG at step 3 after 5 s: ranks 2, 3 wait in all_reduce #3 of group [0, 1, 2, 3] (hang.py:64); "
                  "ranks 0, 1 never entered it, each waits in send #6 to rank 2, 3 in turn (hang.py:50)",
    "busy": "HANG at step 3 after 6 s: ranks 0, 2, 3 wait in all_reduce #3 of group [0, 1, 2, 3] (hang.py:64); "
            "rank 1 never entered it, it is in no collective: busy in Python at hang.py:62 (<genexpr>)",
}


def load(kind: str) -> dict:
    return json.loads((DATA / f"{kind}.json").read_text())


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_kind_is_named_from_real_records(kind):
    doc = load(kind)
    assert diagnose(doc["records"], doc["world_size"], doc["idle_s"]) == [EXPECTED[kind]]


def test_a_mismatch_at_one_sequence_number_names_both_sides_and_a_silent_rank_is_named():
    doc = load("skip")
    records = doc["records"]
    last = [e for e in records["1"]["collectives"] if e["group"] == [0, 1]][-1]
    last.update(op="broadcast", shapes=[[16]], where="hang.py:46")  # rank 1's TP collective #3 differs
    del records["3"]
    lines = diagnose(records, 4, 60.4)
    assert lines == ["HANG at step 3 after 60 s: MISMATCH in collective #3 of group [0, 1]: rank 0 runs all_reduce "
                     "[8] float (hang.py:45); rank 1 runs broadcast [16] float (hang.py:46)",
                     "rank 3 sent no record (died, or stuck in C code holding the interpreter's lock)"]


def test_a_hang_before_any_step_and_a_collective_without_tensors_read_plainly():
    """Code with no optimizer step to count (or a hang in step 1) is not said to hang "at step 1",
    and a barrier (no tensor) is named without an empty shape."""
    records = load("skip")["records"]
    for rec in records.values():
        rec["step"] = 0
    last = [e for e in records["1"]["collectives"] if e["group"] == [0, 1]][-1]
    last.update(op="barrier", shapes=[], dtypes=[], where="hang.py:46")
    lines = diagnose(records, 4, 11.2)
    assert lines == ["HANG before any step ended, after 11 s: MISMATCH in collective #3 of group [0, 1]: rank 0 runs "
                     "all_reduce [8] float (hang.py:45); rank 1 runs barrier (hang.py:46)"], lines


def test_torch_detail_message_is_named_on_both_sides():
    text = ("Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint("
            "SequenceNumber=2, OpType=ALLREDUCE, TensorShape=[16], TensorDtypes=Float, TensorDeviceTypes="
            "TensorOptions(dtype=float (default), device=cpu)), but Rank 0 is running collective: "
            "CollectiveFingerPrint(SequenceNumber=2, OpType=BROADCAST, TensorShape=[8], TensorDtypes=Double, "
            "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)).Collectives differ")
    assert fingerprint_mismatch(text, 3) == ("MISMATCH in collective #3 of rank 3's group: rank 3 (group rank 1) "
                                             "runs all_reduce [16] float, group rank 0 runs broadcast [8] double")
    assert fingerprint_mismatch("RuntimeError: Connection reset by peer", 0) is None


def test_the_environment_carries_the_limit_and_the_check():
    assert Instruments().env() == {} and Instruments.from_env({}).stall_s == 60.0
    env = Instruments(stall_s=5, check_collectives=True).env()
    assert env == {"SIMCLUSTER_STALL_S": "5", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    assert Instruments.from_env(env) == Instruments(stall_s=5, check_collectives=True)
    assert Instruments(stall_s=0).env() == {"SIMCLUSTER_STALL_S": "0"} and Instruments.from_env({"SIMCLUSTER_STALL_S": "nan"}).stall_s == 0


def test_slurm_up_instruments_your_code_as_its_batch_script_cannot():
    """`up --target slurm` runs the batch script unchanged; its sbatch exports the instruments (the boot
    folder, the run folder, torchrun's --tee with the rank prefix), so --stall-s is taken there, while
    `generate --target slurm` (a real cluster's stock torchrun) refuses it (above)."""
    from simcluster.launcher.engines.registry import engine_named
    from simcluster.launcher.engines.slurm.run import submit_env
    from simcluster.launcher.job.options import resolve
    from simcluster.launcher.job.request import make_request
    from simcluster.launcher.job.sections import UpOptions

    req = make_request("up", module="gpuprog", image="simcluster/trainer:latest", nodes=2, nproc_per_node=2,
                       stall_s=5, target="slurm", run_dir="runs/g")
    launch = resolve(req, "1000:1000")[0]
    engine_named("slurm").check(launch, req.section(UpOptions))  # no ConfigError: the simulation instruments it
    assert submit_env(launch, "/work/runs/g") == {
        "SIMCLUSTER_SETUP": "true", "PYTHONPATH": "/work/simcluster/launcher/instrument/boot:/work",
        "SIMCLUSTER_INSTRUMENT": "1", "SIMCLUSTER_OUTPUT_DIR": "/work/runs/g", "PET_TEE": "3",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
    assert not any("," in v for v in submit_env(launch, "/work/runs/g").values())  # sbatch --export's separator
    trainer = make_request("up", model="tiny", mesh="2x1x1", target="slurm", run_dir="runs/t")
    assert submit_env(resolve(trainer, "1000:1000")[0], "/work/runs/t") == {"SIMCLUSTER_SETUP": "true"}


@pytest.mark.parametrize("flags, message", [
    (["--stall-s", "-1"], "--stall-s: must be 0 (off) or a finite number of seconds in [5, 1e+06] (below 5 s the "
                          "watch, which looks once a second, would call a healthy job hung), got -1.0"),
    (["--stall-s", "4.9"], "--stall-s: must be 0 (off) or a finite number of seconds in [5, 1e+06]"),
    (["--stall-s", "nan"], "stall_s: must be a finite number, got nan; e.g. stall_s=60 (--stall-s 60)"),
    (["--stall-s", "5", "--target", "slurm"], "--stall-s 5: a slurm document runs your code's ranks without the "
                                              "instruments (stock torchrun, no node wrapper)"),
    (["--check-collectives", "2"], "--check-collectives: 0 or 1, got 2"),
])
def test_bad_stall_input_exits_2_naming_the_fix(tmp_path, flags, message):
    proc = subprocess.run([sys.executable, "-m", "launcher", "generate", "--script", "examples/hang.py", "--nodes", "2",
                           "--nproc-per-node", "2", *flags, "--out", str(tmp_path / "c.yml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "c.yml").exists()


def test_a_stall_beyond_the_timeout_raises_the_timeout_with_it(tmp_path):
    from simcluster.train.stallwatch import group_timeout_s

    for flags in (["--mesh", "2x1x1", "--model", "tiny", "--timeout-s", "20", "--stall-s", "30"],
                  ["--script", "examples/hang.py", "--nodes", "2", "--nproc-per-node", "2", "--stall-s", "61"]):
        proc = subprocess.run([sys.executable, "-m", "launcher", "generate", *flags, "--out", str(tmp_path / "c.yml")],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert group_timeout_s(30, 20) == 60 and group_timeout_s(None, 60) == 90 and group_timeout_s(0, 60) == 60
    assert group_timeout_s(None, 20) == 20  # the default watch is off under a shorter timeout


class Store:
    """The store calls the watch makes, in memory (TCPStore's semantics: bytes values, add on a counter)."""

    def __init__(self):
        self.d: dict[str, bytes] = {}

    def set(self, key, value):
        self.d[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys):
        return all(k in self.d for k in keys)

    def multi_get(self, keys):
        return [self.d[k] for k in keys]

    def get(self, key):
        return self.d[key]

    def add(self, key, n):
        self.d[key] = str(int(self.d.get(key, b"0")) + n).encode()
        return int(self.d[key])


@pytest.mark.parametrize("states, verdict", [
    ({0: (-100, 0), 1: (-100, 0)}, "note"),  # every rank outside communication for 100 s: a note, the job goes on
    ({0: (-100, 0), 1: (-100, -5)}, None),  # rank 1 waits 5 s after 100 quiet ones (a first compile, then a wait): not yet
    ({0: (-100, 0), 1: (-100, -11)}, "hang"),  # ... 11 s: a hang of 11 s
    ({0: (-100, 0), 1: (-100, -11)}, "busy"),  # ... but rank 1's watch does not answer (it holds the GIL: working)
    ({0: (-3, 0), 1: (-100, -50)}, None),  # rank 1 waits long, but rank 0 progressed 3 s ago
])
def test_the_watch_declares_a_hang_only_while_a_rank_waits_in_communication(states, verdict, capsys, monkeypatch):
    import time

    from simcluster.train import stallwatch

    monkeypatch.setattr(stallwatch, "NOTE_WAIT_S", 0.5)
    watch = stallwatch.Watch(10.0, "/nowhere", 0)
    watch.store, watch.world, now = Store(), 2, time.time()
    watch.main = threading.main_thread()
    for r, (last, wait) in states.items():
        watch.store.set(f"{stallwatch.PREFIX}progress/{r}", f"{now + last!r} {now + wait if wait else 0.0!r}")
    if verdict != "busy":  # rank 1's watch answers the question rank 0 asks (its next beat's _answer)
        watch.store.set(f"{stallwatch.PREFIX}doing/1/1", "at train.py:9 (main)")
    signal = watch._watch(0)
    err = capsys.readouterr().err
    assert (signal >= stallwatch.DECLARE) == (verdict == "hang") and (signal == 1) == (verdict in ("note", "busy"))
    if verdict == "hang":
        assert 10.9 <= json.loads(watch.store.get(stallwatch.DUMP))["idle_s"] <= 13
    assert not watch.store.check([stallwatch.DUMP]) or verdict == "hang"
    assert ("[simcluster] note: no rank progressed for 100 s and none waits" in err) == (verdict == "note"), err
    if verdict in ("note", None):  # (a declared hang: _beat asks no more)
        assert watch._watch(signal) == signal and capsys.readouterr().err == ""  # a note once per quiet spell


def test_a_compile_under_way_is_told_from_compiled_code_running():
    from simcluster.train.commstate import compiling

    def frame_of(path: str):
        scope: dict = {}
        exec(compile("import sys\nframe = sys._getframe()", path, "exec"), scope)
        return scope["frame"]

    assert compiling(frame_of("/venv/torch/_dynamo/convert_frame.py"))
    assert compiling(frame_of("/venv/torch/_inductor/compile_fx.py"))
    assert not compiling(frame_of("/venv/torch/_dynamo/eval_frame.py")) and not compiling(None)


def test_every_rank_outside_communication_is_no_hang_on_the_host(tmp_path):
    """torchrun, 2 ranks with the instruments; both sleep 3 stall limits after step 1: a note, exit 0."""
    need_torch()
    env = {**os.environ, "PYTHONPATH": f"{BOOT}{os.pathsep}{ROOT}", "SIMCLUSTER_INSTRUMENT": "1",
           "SIMCLUSTER_OUTPUT_DIR": str(tmp_path), "SIMCLUSTER_STALL_S": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "compile.py"),
                           "--eager-only", "--pause-s", "6"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[simcluster] note: no rank progressed for " in proc.stderr and "so this is no hang" in proc.stderr
    sleep = 1 + (ROOT / "examples" / "compile.py").read_text().splitlines().index("            time.sleep(a.pause_s)")
    assert f"ranks 0, 1 at compile.py:{sleep} (main)" in proc.stderr, proc.stderr[-3000:]  # where they sleep
    assert proc.stdout.count(" eager ") == 3 and not (tmp_path / "hang.json").exists()


def test_a_busy_rank_is_named_on_the_host(tmp_path):
    """torchrun, 4 ranks, the instruments as the cluster loads them (fresh interpreters), rank 1
    spinning at step 3; rank 3 starts 9 s late (3 stall limits): a slow start-up is no stall."""
    need_torch()
    env = {**os.environ, "PYTHONPATH": f"{BOOT}{os.pathsep}{ROOT}", "SIMCLUSTER_INSTRUMENT": "1",
           "SIMCLUSTER_OUTPUT_DIR": str(tmp_path), "SIMCLUSTER_STALL_S": "3", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", "4", str(ROOT / "examples" / "hang.py"),
                           "--kind", "busy", "--start-delay", "9"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "exitcode  : 4" in proc.stdout + proc.stderr
    hang = json.loads((tmp_path / "hang.json").read_text())
    assert hang["diagnosis"][0].startswith("HANG at step 3 after ")
    assert ("ranks 0, 2, 3 wait in all_reduce #3 of group [0, 1, 2, 3] (hang.py:64); rank 1 never entered it, it is "
            "in no collective: busy in Python at hang.py:62") in hang["diagnosis"][0]
    assert sorted(hang["records"]) == ["0", "1", "2", "3"] and hang["missing"] == []
    stack = (tmp_path / "stacks" / "rank-1.txt").read_text()
    assert "every thread's Python stack" in stack and 'hang.py", line 62' in stack


@pytest.mark.docker
def test_a_short_pipeline_stage_on_a_2x2x2_mesh_is_named(tmp_path, trainer_image):
    """simcluster.run on a 2x2x2 mesh (8 ranks, 2 containers): the last stage runs one microbatch
    fewer at step 3; `up` exits 4, Run.hang names the stage's ranks and lines, every rank left its
    stack, and `launcher report` shows the diagnosis."""
    import simcluster

    run = simcluster.run(script=str(ROOT / "examples" / "hang.py"), mesh="2x2x2", stall_s=8,
                         run_dir=str(tmp_path / "hang"), quiet=True, args=["--kind", "microbatch"])
    assert run.exit_code == 4 and not run.ok, run.summary
    assert run.hang and run.hang[0].startswith("HANG at step 3 after "), run.summary
    assert run.hang[0].endswith("ranks 4, 5, 6, 7 wait in all_reduce #3 of group [0, 1, 2, 3, 4, 5, 6, 7] (hang.py:64); "
                                "ranks 0, 1, 2, 3 never entered it, each waits in send #6 to rank 4, 5, 6, 7 in turn "
                                "(hang.py:50)"), run.hang
    assert "HANG         at step 3" in run.summary and run.summary.startswith("== summary: HANG ==")
    # every rank exited 4, and each node says so rather than torchrun's 1 for a failed worker
    assert run.summary.count("exit 4 (its ranks ended by the stall watch: hang.json)") == 2, run.summary
    assert sorted(os.listdir(tmp_path / "hang" / "stacks")) == [f"rank-{r}.txt" for r in range(8)]
    report = subprocess.run([sys.executable, "-m", "launcher", "report", "--run-dir", str(tmp_path / "hang")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0 and run.hang[0] in report.stdout, report.stdout + report.stderr
    assert "<h2>Hang</h2>" in (tmp_path / "hang" / "report" / "index.html").read_text()


def test_the_record_skips_the_folders_named_to_it_and_spells_no_launcher_path(tmp_path, monkeypatch):
    """train/ names nothing of launcher/: the instruments name their own folder to the record
    (launcher/instrument/rank.py), whose frames are then not the caller to name."""
    from simcluster.train import commrecord

    import ast

    tree = ast.parse((ROOT / "train" / "commrecord.py").read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr)}
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docs]
    assert strings and not [s for s in strings if "launcher" in s], strings  # no path to launcher/ spelled
    monkeypatch.setattr(commrecord, "_SKIPPED", [])
    wrapper, user = tmp_path / "wrap" / "dist.py", tmp_path / "wrapped.py"
    assert not commrecord.foreign(str(wrapper)) and not commrecord.foreign(str(user))
    commrecord.skip_frames_under(str(tmp_path / "wrap"))
    commrecord.skip_frames_under(str(tmp_path / "wrap") + "/")  # idempotent
    assert commrecord._SKIPPED == [str(tmp_path / "wrap") + os.sep]
    assert commrecord.foreign(str(wrapper)) and not commrecord.foreign(str(user))  # a prefix of a folder, not a name


def test_every_rank_inside_one_collective_with_its_whole_group_is_no_hang():
    """512 ranks all inside all-reduce #3 of the world (a slow gloo collective at load 1,200) were declared
    a hang; now the watch's rule (train/stallstate.py) finds the collective under way. A rank in a
    send/recv, or a member of the group not inside, still makes it a hang."""
    from simcluster.train.stallstate import RankState, beat_s, parse, under_way

    inside = [RankState(10.0, 12.0, (("0", 3, 4),)) for _ in range(4)]
    assert under_way(inside) == ("0", 3, 4)
    assert [parse(s.text()) for s in inside] == inside
    assert under_way(inside[:3] + [RankState(11.0)]) is None  # one member never entered it
    assert under_way(inside[:3] + [RankState(11.0, 12.0, (("0", 3, 4), ("p2p", 0, 0)))]) is None  # one in a recv too
    assert under_way(inside[:3] + [RankState(11.0, 12.0, (("0", 2, 4),))]) is None  # one a collective behind
    two_groups = [RankState(1.0, 2.0, (("1", 5, 2),))] * 2 + [RankState(1.0, 2.0, (("2", 7, 2),))] * 2
    assert under_way(two_groups) == ("1", 5, 2)
    assert parse("5.0 7.5") == RankState(5.0, 7.5)  # the older form
    assert (beat_s(8, 60), beat_s(512, 60), beat_s(512, 10), beat_s(4096, 60)) == (1.0, 8.0, 2.0, 12.0)


def test_a_diagnosis_of_many_ranks_is_written_in_spans():
    """At 512 ranks the diagnosis listed the world group's 512 ranks once per rank (1.2 MB on one
    line); ranks doing the same are joined and long lists written as spans."""
    from simcluster.core.hang_diagnosis import diagnose, spans

    group = list(range(512))
    records = {r: {"step": 2, "top": "clip.py:59 (clip)", "collectives": [
        {"op": "all_reduce", "seq": 3, "group": group, "state": "entered", "where": "clip.py:59", "t": 1.0}]}
        for r in group}
    lines = diagnose(records, 512, 76)
    assert lines == ["HANG at step 3 after 76 s: ranks 0-511 wait in all_reduce #3 of group [0-511] (clip.py:59)"]
    assert spans([0, 1, 2, 3, 4, 5, 6, 7, 9]) == "0-7, 9" and spans([5, 1, 3]) == "1, 3, 5"


@pytest.mark.parametrize("calls, verdict", [
    (("0:3:2", "0:3:2"), "slow"),  # both inside all-reduce #3 of their group of 2: under way, a note once
    (("0:3:2", "0:3:2,p2p:0:0"), "hang"),  # rank 1 in a recv as well: a hang
    (("0:3:2", "0:2:2"), "hang"),  # rank 1 a collective behind: a hang
])
def test_the_watch_tells_a_slow_collective_from_a_hang(calls, verdict, capsys, monkeypatch):
    import time

    from simcluster.train import stallwatch

    monkeypatch.setattr(stallwatch, "NOTE_WAIT_S", 0.5)
    watch = stallwatch.Watch(10.0, "/nowhere", 0)
    watch.store, watch.world, now = Store(), 2, time.time()
    watch.main = threading.main_thread()
    for r, call in enumerate(calls):
        watch.store.set(f"{stallwatch.PREFIX}progress/{r}", f"{now - 100!r} {now - 11!r} {call}")
    watch.store.set(f"{stallwatch.PREFIX}doing/1/1", "at train.py:9 (main)")
    signal = watch._watch(0)
    err = capsys.readouterr().err
    assert (signal >= stallwatch.DECLARE) == (verdict == "hang"), (signal, err)
    assert ("together with all 2 ranks of its group" in err) == (verdict == "slow"), err
    if verdict == "slow":
        assert watch._watch(signal) == signal and capsys.readouterr().err == ""  # once per quiet spell
