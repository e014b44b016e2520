"""The stream-side wait of StageMessenger (CUDA's mode) still ends a hung job, naming the task.

[Note: waiting without draining the GPU] in schedlang.runtime.p2p: on CUDA the
messenger waits on the stream and a watchdog thread enforces the timeout. The
mode is forced here on gloo, where a wait blocks the host, which is the harder
case for the watchdog: the waiting thread never returns by itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from runtime_harness import free_port

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    from schedlang.runtime.p2p import StageMessenger

    rank, mode = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{sys.argv[3]}")
    messenger = StageMessenger(rank, torch.device("cpu"), 2.0, None, None, wait_on_stream=True)
    if rank == 0:
        if mode == "hang":
            time.sleep(30)
        else:
            messenger.send(torch.arange(6.0).reshape(2, 3), 1, False, "the activation of task 0F0.0")
            messenger.finish_sends()
    else:
        received = messenger.receive((2, 3), torch.float32, 0, False, "the activation that task 1F0.0 needs")
        assert torch.equal(received, torch.arange(6.0).reshape(2, 3)), received
        time.sleep(0.3)  # let the watchdog poll and forget the completed receive
        assert not messenger.watchdog._watched, messenger.watchdog._watched
        print("received", flush=True)
    dist.destroy_process_group()
    """
)


def run_pair(mode: str) -> tuple[list[subprocess.Popen], float]:
    port = free_port()
    started = time.monotonic()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), mode, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    return processes, started


def test_stream_side_wait_delivers_and_forgets_completed_messages():
    processes, _ = run_pair("send")
    outputs = [process.communicate(timeout=60) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert "received" in outputs[1][0]


def test_watchdog_ends_a_rank_whose_peer_hangs_and_names_the_task():
    processes, started = run_pair("hang")
    try:
        _, stderr = processes[1].communicate(timeout=25)
        elapsed = time.monotonic() - started
    finally:
        for process in processes:
            process.kill()
            process.communicate()
    assert processes[1].returncode == 1, stderr
    assert (
        "PeerTimeoutError: rank 1 waited for the activation that task 1F0.0 needs from rank 0 and gave up after 2s"
        in stderr
    )
    assert elapsed < 20
