"""benchmarks/loss_head.py runs its whole path on the CPU with --tiny: both paths, the fused one per block."""

from benchmarks.loss_head import main


def test_the_tiny_benchmark_prints_both_paths_and_they_agree(capsys):
    assert main(["--tiny", "--tokens", "37", "--block-tokens", "default", "8", "--warmup", "0", "--iterations", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    header, rows = rows[0], rows[2:]
    assert [cell.strip() for cell in header][:2] == ["path", "block tokens"]
    assert [(row[0].strip(), row[1].strip()) for row in rows][0] == ("plain", "-")
    assert [row[0].strip() for row in rows[1:]] == ["fused (torch)", "fused (torch)"]  # the CPU's runtime choice
    assert rows[2][1].strip() == "8"
    for row in rows:
        assert float(row[2]) > 0 and float(row[3]) > 0  # fwd+bwd and fwd milliseconds
        assert float(row[6]) < 1e-3 and float(row[7]) < 2e-2  # loss and dh against the plain path, in bf16


def test_the_fused_path_runs_once_per_loss_backend(capsys):
    assert main(["--tiny", "--dtype", "fp32", "--tokens", "19", "--loss-backends", "torch", "triton", "--warmup", "0",
                 "--iterations", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][2:]
    assert [row[0].strip() for row in rows] == ["plain", "fused (torch)", "fused (torch)"]  # the CPU: PyTorch's
    for row in rows[1:]:
        assert float(row[6]) < 1e-6 and float(row[7]) < 1e-5  # float32: loss and dh as the plain path's
