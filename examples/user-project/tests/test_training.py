"""The example project's tests: its train.py on a simulated cluster, through the simcluster pytest plugin.

    pip install "simcluster[pytest]" && simcluster build     # once: the plugin and the trainer image
    python -m pytest -n 2 tests                               # from this folder; -n 2: two runs at a time

Each ``simcluster(...)`` call starts a fresh cluster of Docker containers (one per node), runs
train.py with torchrun on every node, waits for its end and tears it down; the Run it returns
is read from the run's folder under the test's tmp_path.
"""
import pytest

from simcluster import Kill

pytestmark = pytest.mark.simcluster(wall_timeout_s=300, timeout_s=30)


def test_the_loss_falls_on_two_nodes(simcluster):
    run = simcluster(script="train.py", nodes=2, nproc_per_node=2, args=["--tp", "2", "--steps", "6"])
    assert run.ok, run.summary
    losses = run.values("loss")
    assert len(losses) == 6 and losses[-1] < 0.9 * losses[0], losses


def test_fsdp_and_tp_match_one_process(simcluster):
    result = simcluster.compare(script="train.py", mesh="1x2x2", against_nodes=1, against_nproc_per_node=1,
                                args=["--steps", "3"], rtol=1e-4)
    assert result.ok, result


def test_a_killed_node_is_survived_by_resuming_from_the_checkpoint(simcluster):
    run = simcluster(script="train.py", nodes=2, nproc_per_node=2, args=["--tp", "2", "--steps", "8", "--ckpt-every", "1"],
                     chaos=Kill("node-1", at_step=3), max_restarts=1)
    assert run.ok, run.summary
    assert any(line.startswith("chaos: kill node-1") for line in run.chaos), run.chaos
    resumed = [line for line in run.logs(rank=0) if line.startswith("resumed from step")]
    assert resumed and 2 <= int(resumed[0].split()[-1]) < 8, run.logs(rank=0)  # the newest complete one
    assert [row["step"] for row in run.metrics] == list(range(1, 9))


def test_a_tp_that_does_not_divide_the_world_names_the_ranks_error(simcluster):
    run = simcluster(script="train.py", nodes=2, nproc_per_node=2, args=["--tp", "3"])
    assert not run.ok
    # A rank still connecting its process group when the first one raised fails on the closed
    # connection (peer_failed): a consequence, listed after the causes.
    causes = [f for f in run.failed if not f.peer_failed]
    assert causes and all("--tp 3 does not divide world size 4" in f.error for f in causes), run.failed
    assert {f.node for f in run.failed} <= {"node-0", "node-1"}
