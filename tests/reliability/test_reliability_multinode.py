"""Several machines: one `schedlang run` per node over torchrun's static rendezvous, here two on localhost."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reliability_helpers import TWO_RANK_SCHEDULE, free_port, run_cli
from schedlang.launch import LaunchRequest, Nodes, nodes_problem, torchrun_command


@pytest.mark.slow
def test_two_launchers_on_one_machine_train_like_one(tmp_path):
    schedule = tmp_path / "two.sched"
    schedule.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    endpoint = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "schedlang", "run", str(schedule), "--device", "cpu", "--nnodes", "2",
               "--rdzv-endpoint", endpoint, "--metrics"]
    second = subprocess.Popen(
        command + [str(tmp_path / "node1.jsonl"), "--node-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    first = subprocess.run(
        command + [str(tmp_path / "node0.jsonl"), "--node-rank", "0"], capture_output=True, text=True, timeout=240
    )
    second_out, second_err = second.communicate(timeout=240)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second_err
    assert "(node 0 of 2: 1 of them here)" in first.stdout
    assert "done on node 1 of 2 (node 0 prints the losses)" in second_out
    alone = run_cli("run", schedule, "--device", "cpu", "--metrics", tmp_path / "alone.jsonl", timeout=240)
    assert alone.returncode == 0, alone.stderr
    assert (tmp_path / "node0.jsonl").read_text().count("\n") == 2
    losses = [line.split('"loss": ')[1].split(",")[0] for line in (tmp_path / "node0.jsonl").read_text().splitlines()]
    alone_losses = [line.split('"loss": ')[1].split(",")[0] for line in (tmp_path / "alone.jsonl").read_text().splitlines()]
    assert losses == alone_losses


@pytest.mark.parametrize(
    "count, rank, endpoint, expected",
    [
        (0, None, None, "--nnodes must be at least 1, got 0"),
        (1, 1, None, "--node-rank and --rdzv-endpoint need --nnodes > 1"),
        (3, 0, "h:1", "--nnodes 3 does not divide the mesh's 4 ranks into equal nodes"),
        (2, 2, "h:1", "--node-rank must be one of 0 .. 1 with --nnodes 2, got 2"),
        (2, 0, "node0", "--rdzv-endpoint must be HOST:PORT (node 0's address and a free port), got 'node0'"),
        (2, 0, "node0:99999", "--rdzv-endpoint must be HOST:PORT (node 0's address and a free port), got 'node0:99999'"),
        (2, 1, "node0:29500", None),
        (1, None, None, None),
    ],
)
def test_node_arguments_are_checked_before_launch(count, rank, endpoint, expected):
    assert nodes_problem(count, rank, endpoint, world_size=4) == expected


def test_the_torchrun_command_passes_the_nodes_through(tmp_path):
    request = LaunchRequest(tmp_path / "train.py", 4, "cuda", nodes=Nodes(2, 1, "node0:29500"))
    command = torchrun_command(request)
    assert "--standalone" not in command
    assert ["--nnodes=2", "--node-rank=1", "--rdzv-backend=static", "--rdzv-endpoint=node0:29500",
            "--nproc-per-node=4"] == command[3:8]


def test_run_refuses_bad_node_arguments_without_launching(tmp_path):
    schedule = tmp_path / "two.sched"
    schedule.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    completed = run_cli("run", schedule, "--device", "cpu", "--nnodes", "2", "--node-rank", "0", timeout=60)
    assert completed.returncode == 1
    assert completed.stderr.strip() == "schedlang: error: --rdzv-endpoint must be HOST:PORT (node 0's address and a free port), got None"
    assert "training" not in completed.stdout
