"""Outputs never name a file schedlang did not write (unless --force), are renamed into place rather than written
through a link, and are never special files ([Note: file safety] in schedlang.vocabulary.files)."""

from __future__ import annotations

import os

import pytest

from reliability_helpers import TWO_RANK_SCHEDULE, one_rank_schedule, run_cli


@pytest.fixture
def schedule(tmp_path):
    path = tmp_path / "two.sched"  # one chunk per microbatch, so that torch's CSV can hold it
    path.write_text(TWO_RANK_SCHEDULE.replace("chunks = 2", "chunks = 1"), encoding="utf-8")
    return path


def test_run_refuses_metrics_over_a_data_file_before_launch(tmp_path):
    data = tmp_path / "data" / "train.bin"
    data.parent.mkdir()
    data.write_bytes(bytes(range(256)) * 64)
    schedule = tmp_path / "one.sched"
    schedule.write_text(one_rank_schedule(1, 'data = bytes(path = "data/train.bin")'), encoding="utf-8")
    completed = run_cli("run", schedule, "--device", "cpu", "--metrics", data, timeout=60)
    assert completed.returncode == 1
    assert f"{data} exists and is not a metrics file schedlang wrote; give another path, or --force" in completed.stderr
    assert "training" not in completed.stdout
    assert data.read_bytes() == bytes(range(256)) * 64


@pytest.mark.parametrize("device", ["/dev/full", "/dev/zero", "/dev/null"])
def test_run_refuses_a_device_as_metrics_even_with_force(schedule, device):
    completed = run_cli("run", schedule, "--device", "cpu", "--metrics", device, "--force", timeout=60)
    assert completed.returncode == 1
    assert f"{device} is a character device, not a regular file" in completed.stderr


@pytest.mark.parametrize("command", ["compile", "run", "export"])
def test_an_output_in_a_missing_folder_is_named_before_anything_runs(schedule, tmp_path, command):
    output = tmp_path / "missing" / "out.file"
    arguments = {"compile": ["-o"], "run": ["--device", "cpu", "--metrics"], "export": ["--format", "torch-csv", "-o"]}
    completed = run_cli(command, schedule, *arguments[command], output, timeout=60)
    assert completed.returncode == 1
    assert f"{output} cannot be written: its folder {output.parent} does not exist" in completed.stderr
    assert "Traceback" not in completed.stderr and "training" not in completed.stdout
    assert not output.parent.exists()


def test_a_fifo_output_is_refused_without_blocking(schedule):
    fifo = schedule.parent / "out.dot"
    os.mkfifo(fifo)
    completed = run_cli("viz", schedule, "--format", "dot", "-o", fifo, "--force", timeout=60)
    assert completed.returncode == 1
    assert f"{fifo} is a FIFO, not a regular file" in completed.stderr


@pytest.mark.parametrize(
    "arguments, name",
    [
        (("compile", "two.sched", "-o"), "precious.py"),
        (("viz", "two.sched", "--format", "dot", "-o"), "precious.dot"),
        (("viz", "two.sched", "--format", "chrome", "-o"), "precious.json"),
        (("export", "two.sched", "--format", "torch-csv", "-o"), "precious.csv"),
        (("run", "two.sched", "--device", "cpu", "--keep-script"), "precious.py"),
    ],
    ids=["compile", "viz-dot", "viz-chrome", "export", "run-keep-script"],
)
def test_an_existing_foreign_file_is_kept_unless_force(schedule, arguments, name):
    precious = schedule.parent / name
    precious.write_text("mine\n", encoding="utf-8")
    refused = run_cli(*arguments, name, cwd=schedule.parent, timeout=60)
    assert refused.returncode == 1
    assert f"{name} exists and is not a" in refused.stderr and "--force" in refused.stderr
    assert precious.read_text(encoding="utf-8") == "mine\n"
    if arguments[0] == "run":
        return  # --force would train; the refusal is what is asked here
    written = run_cli(*arguments, name, "--force", cwd=schedule.parent, timeout=60)
    assert written.returncode == 0, written.stderr
    assert precious.read_text(encoding="utf-8") != "mine\n"
    again = run_cli(*arguments, name, cwd=schedule.parent, timeout=60)  # schedlang's own output is replaced
    assert again.returncode == 0, again.stderr


def test_import_keeps_a_schedule_the_user_wrote_unless_force(schedule):
    """`schedlang import -o` onto the user's own schedule is refused; its own earlier import is replaced."""
    assert run_cli("export", schedule, "--format", "torch-csv", "-o", "order.csv", cwd=schedule.parent).returncode == 0
    mine = schedule.read_text(encoding="utf-8")
    refused = run_cli("import", "order.csv", "-o", schedule.name, cwd=schedule.parent, timeout=60)
    assert refused.returncode == 1
    assert f"{schedule.name} exists and is not a schedule file schedlang wrote" in refused.stderr
    assert schedule.read_text(encoding="utf-8") == mine
    for _ in range(2):  # a new file, then its own import replaced
        assert run_cli("import", "order.csv", "-o", "imported.sched", cwd=schedule.parent).returncode == 0
    assert run_cli("import", "order.csv", "-o", schedule.name, "--force", cwd=schedule.parent).returncode == 0
    assert schedule.read_text(encoding="utf-8").startswith("# Imported by `schedlang import` from order.csv")


def test_viz_png_replaces_its_own_chart_only(schedule):
    chart = schedule.parent / "chart.png"
    assert run_cli("viz", schedule, "--format", "png", "-o", chart, timeout=120).returncode == 0
    assert run_cli("viz", schedule, "--format", "png", "-o", chart, timeout=120).returncode == 0
    chart.write_bytes(b"\x89PNG\r\n\x1a\nsomeone else's")
    refused = run_cli("viz", schedule, "--format", "png", "-o", chart, timeout=120)
    assert refused.returncode == 1 and "is not a PNG chart schedlang wrote" in refused.stderr


def test_an_output_link_is_replaced_never_written_through(schedule, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("keep me\n", encoding="utf-8")
    link = tmp_path / "job.py"
    link.symlink_to(outside)
    refused = run_cli("compile", schedule, "-o", link, timeout=60)
    assert refused.returncode == 1 and "is a symbolic link" in refused.stderr
    forced = run_cli("compile", schedule, "-o", link, "--force", timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert not link.is_symlink() and link.read_text(encoding="utf-8").startswith('"""Train schedule')
    assert outside.read_text(encoding="utf-8") == "keep me\n"


def test_export_model_to_standard_output_is_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    completed = run_cli("export-model", tmp_path / "ckpt", "-o", "-", cwd=tmp_path, timeout=60)
    assert completed.returncode == 1
    assert "-o - cannot hold one" in completed.stderr
    assert not (tmp_path / "-").exists()


def test_writing_replaces_a_link_and_appending_refuses_one(tmp_path):
    from schedlang.vocabulary.files import UnsafeFileError, open_for_append, write_replacing

    outside = tmp_path / "outside"
    outside.write_text("keep\n", encoding="utf-8")
    link = tmp_path / "config.json"
    link.symlink_to(outside)
    write_replacing(link, "{}\n")
    assert not link.is_symlink() and link.read_text() == "{}\n" and outside.read_text() == "keep\n"
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        open_for_append(link)
    assert outside.read_text() == "keep\n"
    assert not [entry for entry in tmp_path.iterdir() if entry.name.endswith(".tmp")]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_and_a_mode_is_kept(tmp_path):
    """Both replacing writers: an exception inside the write keeps what ``path`` held and removes the temporary
    file; a finished write gets the asked mode less the umask."""
    import os

    from schedlang.vocabulary.files import replacing, write_replacing

    target = tmp_path / "out.py"
    target.write_text("old\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="writer failed"):
        with replacing(target) as temporary:
            temporary.write_text("half", encoding="utf-8")
            raise RuntimeError("writer failed")
    with pytest.raises(TypeError):
        write_replacing(target, 3.5)  # neither bytes nor text: fails inside the write
    assert target.read_text() == "old\n"
    assert not [entry for entry in tmp_path.iterdir() if entry.name.endswith(".tmp")]
    umask = os.umask(0)
    os.umask(umask)
    write_replacing(target, "new\n", mode=0o640)
    with replacing(tmp_path / "other.py", mode=0o600) as temporary:
        temporary.write_text("x", encoding="utf-8")
    assert target.read_text() == "new\n"
    assert (target.stat().st_mode & 0o777, (tmp_path / "other.py").stat().st_mode & 0o777) == (
        0o640 & ~umask, 0o600 & ~umask)


def test_bounded_reads_refuse_devices_fifos_and_long_files(tmp_path):
    from schedlang.vocabulary.files import UnsafeFileError, read_bounded

    with pytest.raises(UnsafeFileError, match="character device"):
        read_bounded("/dev/zero", 1024)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="FIFO"):
        read_bounded(fifo, 1024)
    long = tmp_path / "long"
    long.write_bytes(b"x" * 1025)
    with pytest.raises(UnsafeFileError, match="larger than 1,024 bytes"):
        read_bounded(long, 1024)
    assert read_bounded(long, 1025) == b"x" * 1025


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_schedule_that_is_a_special_file_is_refused_without_reading(tmp_path, special):
    schedule = tmp_path / "s.sched"
    if special == "fifo":
        os.mkfifo(schedule)
    else:
        schedule.symlink_to(special)
    completed = run_cli("check", schedule, timeout=30)
    assert completed.returncode == 1
    assert f"schedule file {schedule} is a" in completed.stderr and "not a regular file" in completed.stderr


@pytest.mark.slow
def test_export_model_replaces_a_link_in_the_output_directory_never_its_target(tmp_path):
    pytest.importorskip("safetensors")
    schedule = tmp_path / "one.sched"
    fla_model = "heads = 1  head_dim = 16  gate_low_rank_dim = 16  output_gate = swish"  # fla's GLA, exportable
    text = one_rank_schedule(1, 'checkpoint = "ckpt" every 1').replace("heads = 1  head_dim = 16", fla_model)
    schedule.write_text(text, encoding="utf-8")
    trained = run_cli("run", schedule, "--device", "cpu", "--steps", "1", timeout=240)
    assert trained.returncode == 0, trained.stderr
    outside = tmp_path / "precious.json"
    outside.write_text("keep me\n", encoding="utf-8")
    output = tmp_path / "out"
    output.mkdir()
    (output / "config.json").symlink_to(outside)
    (output / "model.safetensors").symlink_to(outside)
    completed = run_cli("export-model", tmp_path / "ckpt", "-o", output, "--force", timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert outside.read_text(encoding="utf-8") == "keep me\n"
    assert not (output / "config.json").is_symlink() and '"model_type"' in (output / "config.json").read_text()
    assert not (output / "model.safetensors").is_symlink()
