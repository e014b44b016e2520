"""``schedlang simulate``'s memory table and JSON, and ``--fit`` (schedlang/commands/simulate_fit.py)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlang.cli import main
from schedlang.commands import simulate
from schedlang.commands.simulate_fit import (
    DEFAULT_MAX_CHUNKS,
    GIB,
    SizeError,
    chunk_counts,
    evaluate,
    longest_true,
    parse_size,
)
from schedlang.compiler import CostSettings
from schedlang.frontend import load_program
from schedlang.lowering.cost import CostModelKind
from schedlang.lowering.memory_budget import OUTSIDE_THE_ALLOCATOR
from schedlang.lowering.memory_peak import RESERVED_PER_ALLOCATED, Component

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STATEFLOW = str(EXAMPLES / "gla_stateflow.sched")  # 2 stages, 4 microbatches, 4 chunks of 1024 tokens


def run_simulate(argv):
    parser = argparse.ArgumentParser()
    simulate.add_arguments(parser)
    return simulate.run(parser.parse_args(argv))


def test_table_prints_every_component_per_stage(capsys):
    assert run_simulate([STATEFLOW]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("memory at the peak, GiB      stage 0     stage 1")
    names = [line.split()[0] for line in lines[start + 1 :]]
    assert names[: len(Component) + 1] == [component.value for component in Component] + ["allocated"]
    assert lines[-3].startswith(f"reserved (x{RESERVED_PER_ALLOCATED:g})")
    assert lines[-2].split()[-2:] == ["5", "4"]  # chunks in flight: Eq. 13, N + P - r - 1
    assert lines[-1].split()[-2:] == ["0B2.0", "1B3.3"]


def test_json_memory_per_stage_adds_up(capsys):
    assert run_simulate([STATEFLOW, "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert len(memory) == 2
    for stage in memory:
        parts = sum(stage[component.value] for component in Component)
        assert stage["allocated"] == pytest.approx(parts)
        assert stage["reserved"] == pytest.approx(RESERVED_PER_ALLOCATED * parts)
        assert stage["activations"] > 0 and stage["parameters"] > 0
    assert [stage["chunks_in_flight"] for stage in memory] == [5, 4]


@pytest.mark.parametrize(
    "text, size",
    [
        ("80GB", 80 * 10**9),
        ("141GiB", 141 * GIB),
        ("1.5TiB", int(1.5 * 2**40)),
        ("512mib", 512 * 2**20),
        ("7 GB", 7 * 10**9),
    ],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text, start, end", [("14OGB", 2, 5), ("GiB", 0, 3), ("12XB", 2, 4), ("0GB", 0, 3)])
def test_bad_sizes_name_their_columns(text, start, end):
    with pytest.raises(SizeError) as raised:
        parse_size(text)
    assert (raised.value.start, raised.value.end) == (start, end)


def test_bad_device_memory_is_a_positioned_error():
    with pytest.raises(SystemExit) as raised:
        main(["simulate", STATEFLOW, "--fit", "--device-memory", "141GiBs"])
    prefix = f"schedlang simulate {STATEFLOW} --fit --device-memory "
    assert str(raised.value.code).splitlines() == [
        f"<command line>:1:{len(prefix) + 4}: error: --device-memory: unknown unit 'GiBs': "
        "write one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB",
        prefix + "141GiBs",
        " " * (len(prefix) + 3) + "^~~~",
    ]


def fit(argv, capsys) -> dict:
    assert main(["simulate", STATEFLOW, "--fit", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def fits(candidate, device_memory) -> bool:
    return max(candidate.reserved) + OUTSIDE_THE_ALLOCATOR <= device_memory


def test_fit_proposes_a_length_that_fits_where_the_next_step_does_not(capsys):
    device_memory = 2 * GIB
    result = fit(["--device-memory", "2GiB", "--step", "8192", "--max-length", "262144"], capsys)
    proposal, refused = result["fits"], result["next_does_not_fit"]
    assert refused["length"] == proposal["length"] + 8192
    program = load_program(STATEFLOW)
    cost = CostSettings(CostModelKind.FLOPS)
    chosen = evaluate(program, proposal["length"], proposal["n_chunks"], cost)
    assert fits(chosen, device_memory)
    assert chosen.tokens_per_second == pytest.approx(proposal["tokens_per_second"])
    counts = chunk_counts(proposal["length"], 64, DEFAULT_MAX_CHUNKS)
    same_length = [evaluate(program, proposal["length"], count, cost) for count in counts]
    assert max(c.tokens_per_second for c in same_length if fits(c, device_memory)) == pytest.approx(
        proposal["tokens_per_second"]
    )
    longer = [evaluate(program, refused["length"], count, cost) for count in chunk_counts(refused["length"], 64, DEFAULT_MAX_CHUNKS)]
    assert longer and not any(fits(candidate, device_memory) for candidate in longer)


def test_fit_with_more_memory_proposes_a_longer_sequence(capsys):
    small = fit(["--device-memory", "2GiB", "--step", "8192", "--max-length", "131072"], capsys)["fits"]
    large = fit(["--device-memory", "2.5GiB", "--step", "8192", "--max-length", "131072"], capsys)["fits"]
    assert large["length"] > small["length"]


def test_fit_text_names_the_longest_length(capsys):
    assert main(["simulate", STATEFLOW, "--fit", "--device-memory", "2GiB", "--step", "8192"]) == 0
    out = capsys.readouterr().out
    assert "longest: 16384 tokens in" in out and "24576 tokens does not fit" in out


def test_fit_reports_when_nothing_fits(capsys):
    assert main(["simulate", STATEFLOW, "--fit", "--device-memory", "1.6GiB", "--step", "65536"]) == 1
    assert "nothing fits: at 65536 tokens the smallest peak is" in capsys.readouterr().out


def test_fit_on_a_device_smaller_than_the_memory_outside_the_allocator_says_so(capsys):
    assert main(["simulate", STATEFLOW, "--fit", "--device-memory", "1GiB", "--step", "65536"]) == 1
    out = capsys.readouterr().out
    assert "1.0 GiB (not even the 1.5 GiB a process uses outside PyTorch's allocator: nothing can fit)" in out
    assert main(["simulate", STATEFLOW, "--fit", "--device-memory", "1.6GiB", "--step", "65536"]) == 1
    assert "1.6 GiB (1.5 GiB of it outside PyTorch's allocator)" in capsys.readouterr().out


def test_fit_refuses_hand_placed_chunks_at_their_key(capsys):
    path = str(EXAMPLES / "simple_gla_gpipe.sched")
    assert main(["simulate", path, "--fit"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"{path}:20:3: error: --fit re-cuts the sequence")
    assert lines[1] == "  chunks       = [0, 1024, 2560, 4096]"


def test_fit_refuses_a_step_that_cuts_kernel_chunks(capsys):
    assert main(["simulate", STATEFLOW, "--fit", "--step", "1000"]) == 1
    assert "--step 1000 is not a multiple of the schedule's kernel_chunk (64)" in capsys.readouterr().err


def test_fit_with_split_backward_fits_its_own_schedule(capsys):
    """--split-backward applies to every candidate: stage 1 then holds stage 0's chunks in flight (Eq. 13 of
    stage r - 1), so its peaks are at least the plain schedule's, and above them somewhere."""
    arguments = ["--device-memory", "2GiB", "--step", "8192", "--max-length", "16384"]
    plain, split = (
        {(row["length"], row["n_chunks"]): row["reserved_gib"] for row in fit(options, capsys)["tried"]}
        for options in (arguments, [*arguments, "--split-backward"])
    )
    assert split.keys() == plain.keys()
    assert all(split[key][1] >= plain[key][1] - 1e-9 for key in plain)
    assert any(split[key][1] > plain[key][1] for key in plain)


def json_fits(row: dict, device_memory: int) -> bool:
    return max(row["reserved_gib"]) * GIB + OUTSIDE_THE_ALLOCATOR <= device_memory


def test_fit_recompute_chooses_each_stages_mode_and_fits_at_least_as_long(capsys):
    options = ["--device-memory", "2GiB", "--step", "16384", "--max-length", "65536", "--max-chunks", "8"]
    as_written = fit(options, capsys)
    chosen = fit(["--fit-recompute", *options], capsys)
    device_memory = 2 * GIB
    assert chosen["fits"]["length"] >= as_written["fits"]["length"]
    assert json_fits(chosen["fits"], device_memory)
    per_stage = [candidate for candidate in chosen["tried"] if candidate["recompute"].startswith("[")]
    assert per_stage, "no candidate mixed modes across stages"
    for candidate in per_stage:
        modes = candidate["recompute"].strip("[]").split(", ")
        assert len(modes) == 2 and len(set(modes)) == 2
        assert json_fits(candidate, device_memory), candidate
    assert all(candidate["recompute"] == "none" for candidate in as_written["tried"])


def test_fit_recompute_needs_fit(capsys):
    with pytest.raises(SystemExit, match="--fit-recompute chooses recompute modes for --fit"):
        main(["simulate", STATEFLOW, "--fit-recompute"])


@settings(max_examples=200, deadline=None)
@given(most=st.integers(min_value=1, max_value=5000), data=st.data())
def test_longest_true_finds_the_boundary_of_a_monotone_predicate_in_logarithmic_questions(most, data):
    threshold = data.draw(st.integers(min_value=0, max_value=most), label="threshold")
    asked = []

    def holds(n):
        assert 1 <= n <= most, f"asked about {n} outside 1..{most}"
        asked.append(n)
        return n <= threshold

    found = longest_true(holds, most)
    assert found == ((most, None) if threshold == most else (threshold, threshold + 1))
    assert len(asked) <= 2 * math.ceil(math.log2(most + 1)) + 1


def test_fit_asks_about_few_lengths_and_matches_a_scan_of_every_length(capsys):
    """The bisection's proposal is the length a scan of every step finds, having compiled far fewer lengths."""
    options = ["--device-memory", "2GiB", "--step", "2048", "--max-length", "65536", "--max-chunks", "4"]
    result = fit(options, capsys)
    lengths_tried = {row["length"] for row in result["tried"]}
    program = load_program(STATEFLOW)
    cost = CostSettings(CostModelKind.FLOPS)
    scanned = None
    for length in range(2048, 65536 + 1, 2048):
        if not any(fits(candidate, 2 * GIB) for count in chunk_counts(length, 64, 4)
                   if (candidate := evaluate(program, length, count, cost)) is not None):
            break
        scanned = length
    assert result["fits"]["length"] == scanned
    assert len(lengths_tried) <= 2 * math.ceil(math.log2(32 + 1)) + 1 < 32


ONE_DEVICE = Path(__file__).resolve().parents[2] / "benchmarks" / "schedules" / "gla_1b_one_device.sched"


def offloading_256k(tmp_path) -> str:
    """The one-device 1B GLA at 256K tokens in 8 chunks, recompute = mlp and offload: the candidate that tune
    ranked on the H200 and that did not finish two steps there."""
    text = ONE_DEVICE.read_text()
    for old, new in [("length = 65536", "length = 262144"), ("chunks = 1\n", "chunks = 8\n"),
                     ("recompute      = none", "recompute      = mlp"), ("offload        = false", "offload = true")]:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "offload_256k.sched"
    path.write_text(text)
    return str(path)


def test_simulate_refuses_offload_past_the_hosts_memory_naming_node_stage_and_term(tmp_path, capsys):
    path = offloading_256k(tmp_path)
    assert run_simulate([path, "--hardware", "h200"]) == 1
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert lines[-2].split()[:3] == ["pinned", "host,", "GiB"] and float(lines[-2].split()[-1]) > 128
    assert lines[-1].startswith("pinned host memory per node, GiB: node 0: 142.619")
    error = printed.err.splitlines()
    assert error[0] == (
        f"schedlang simulate: error: {path}: does not fit the host: needs 142.62 GiB of pinned host memory on node 0, "
        "over the 96.00 GiB pinned copies may take there (75% of 128.00 GiB host memory), whose largest term is "
        "offloaded activations of stage 0 (142.62 GiB per rank, pipeline.offload)"
    )
    assert error[1].startswith("  hint: recompute = full")
    assert run_simulate([path, "--hardware", "h200", "--host-memory", "1TB"]) == 0
    assert "does not fit" not in capsys.readouterr().err


def test_json_gives_each_stages_pinned_host_memory_and_the_nodes_misfits(tmp_path, capsys):
    path = offloading_256k(tmp_path)
    assert run_simulate([path, "--hardware", "h200", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["memory"][0]["pinned_host"] == pytest.approx(142.62, abs=0.01)
    host = result["host_memory"]
    assert host["memory_gib"] == 128 and host["pinned_fraction"] == 0.75 and host["gpus_per_node"] == 8
    assert host["nodes_pinned_gib"] == [result["memory"][0]["pinned_host"]]
    (misfit,) = host["does_not_fit"]
    assert (misfit["node"], misfit["stage"], misfit["term"]) == (0, 0, "offloaded activations")
    assert misfit["limit_gib"] == 96
    assert run_simulate([STATEFLOW, "--json"]) == 0  # no offload: nothing pinned, nothing refused
    result = json.loads(capsys.readouterr().out)
    assert all(stage["pinned_host"] == 0 for stage in result["memory"]) and result["host_memory"]["does_not_fit"] == []


def test_a_sweep_names_each_row_the_host_cannot_hold(tmp_path, capsys):
    path = offloading_256k(tmp_path)
    assert run_simulate([path, "--hardware", "h200", "--chunks", "8", "16"]) == 1
    error = capsys.readouterr().err
    assert f"error: {path} (8 chunks, extra_warmup = 0): does not fit the host" in error
    assert f"error: {path} (16 chunks, extra_warmup = 0): does not fit the host" in error


def test_fit_holds_offloading_candidates_to_the_host(tmp_path, capsys):
    """With offload, a smaller host memory gives a shorter longest sequence, and what it proposes fits it."""
    text = Path(STATEFLOW).read_text().replace("order        = 1f1b", "order = 1f1b  offload = true  recompute = mlp")
    source = tmp_path / "offload.sched"
    source.write_text(text)
    options = ["--device-memory", "4GiB", "--step", "8192", "--max-length", "262144", "--max-chunks", "8", "--json"]
    assert main(["simulate", str(source), "--fit", *options]) == 0
    roomy = json.loads(capsys.readouterr().out)
    pinned = max(roomy["fits"]["pinned_host_gib"])
    assert pinned > 0
    small = f"{int(pinned * GIB / 0.75 / 2)}B"  # half what the roomy proposal pins
    assert main(["simulate", str(source), "--fit", *options, "--host-memory", small]) == 0
    tight = json.loads(capsys.readouterr().out)
    assert tight["fits"]["length"] < roomy["fits"]["length"]
    limit = tight["host_memory"]["pinned_limit_gib"]
    assert max(tight["fits"]["pinned_host_gib"]) <= limit < max(tight["next_does_not_fit"]["pinned_host_gib"])


def test_bad_host_memory_is_a_positioned_error():
    with pytest.raises(SystemExit) as raised:
        main(["simulate", STATEFLOW, "--host-memory", "12 XB"])
    prefix = f"schedlang simulate {STATEFLOW} --host-memory "
    lines = str(raised.value.code).splitlines()
    assert lines[0].endswith("error: --host-memory: unknown unit 'XB': write one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")
    assert lines[1] == prefix + "12 XB" and lines[2].index("^") == len(prefix) + 3
