"""benchmarks/layer_parts.py runs end to end on the CPU and checks each system against schedlang's output."""

from benchmarks import layer_parts


def test_layer_parts_runs_every_part_on_the_cpu(capsys):
    assert layer_parts.main(["--device", "cpu", "--length", "64", "--iterations", "1", "--warmup", "0",
                             "--conv-row", "40", "--conv-channels", "24", "--width", "32", "--heads", "2",
                             "--head-dim", "16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" fwd+bwd")[0] for line in lines] == [
        "T=64 short conv C24 of 40 W4 float32", "T=64 norm, gate first D32 float32", "T=64 norm first H2x16 float32"
    ]
    for line in lines:  # the PyTorch composition agrees with the kernel it is timed beside
        error = float(line.split("torch")[1].split("error ")[1].split(")")[0])
        assert error < 1e-6, line
