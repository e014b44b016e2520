"""`check` and `compile` agree: what the checker calls legal compiles, and every refusal of the runtime's
capabilities list is a checker error at its key, all of them in one run; the runtime refuses the same."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from schedlang.cli import main as schedlang_main
from schedlang.compiler import Pass, ScheduleText, compile_schedule, revise
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program, load_program_text
from schedlang.runtime.config import PipelineConfig
from schedlang.runtime.trainer import Trainer
from schedlang.vocabulary import CAPABILITIES, ModelConfig, TrainConfig, UnsupportedRunError, refusals, run_request

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PATHS = sorted((ROOT / "examples").glob("*.sched"))

SCHEDULE = """schedule refusals
model {{ vocab = 256  d_model = 32  heads = 2  head_dim = 16
  layers = [{layers}] }}
mesh {{ pipeline = 2
  sequence = {sequence} }}
sequence {{ length = 256
  chunks = {chunks}  kernel_chunk = 16 }}
pipeline {{ microbatches = 2  order = 1f1b
  cuda_graphs = {cuda_graphs}
  recompute = {recompute}
  offload = {offload} }}
"""


@dataclass(frozen=True)
class Features:
    """One schedule, written both as schedule text and as the runtime's records."""

    layers: tuple[str, ...] = ("gla", "gla")
    sequence: int = 1
    boundaries: tuple[int, ...] = (0, 128, 256)
    cuda_graphs: bool | str = False  # a bool, or a mode's value
    recompute: str = "none"
    offload: bool = False

    def text(self) -> str:
        chunks = "2" if self.boundaries == (0, 128, 256) else str(list(self.boundaries))
        return SCHEDULE.format(
            layers=", ".join(self.layers),
            sequence=self.sequence,
            chunks=chunks,
            cuda_graphs=str(self.cuda_graphs).lower(),
            recompute=self.recompute,
            offload=str(self.offload).lower(),
        )

    def runtime_records(self) -> tuple[ModelConfig, PipelineConfig]:
        half = len(self.layers) // 2
        stage_layers = (tuple(range(half)), tuple(range(half, len(self.layers))))
        return (
            ModelConfig(vocab=256, d_model=32, layers=self.layers, heads=2, head_dim=16),
            PipelineConfig(
                stage_layers=stage_layers,
                chunk_boundaries=self.boundaries,
                microbatches=2,
                microbatch_size=1,
                stage_actions=((), ()),
                recompute=self.recompute,
                offload=self.offload,
                sequence_parallel=self.sequence,
                cuda_graphs=self.cuda_graphs,
            ),
        )


def position_of(text: str, key: str) -> tuple[int, int]:
    """(line, column) of the first ``key =`` in ``text``."""
    for number, line in enumerate(text.splitlines(), 1):
        column = line.find(f"{key} =")
        if column >= 0:
            return number, column + 1
    raise AssertionError(f"{key} is not in the schedule")


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda path: path.stem)
def test_every_example_check_calls_legal_compiles(path, capsys, tmp_path):
    assert schedlang_main(["check", str(path)]) == 0
    assert "legal" in capsys.readouterr().out
    compilation = compile_schedule(path)
    assert compilation.script and compilation.stage_actions and compilation.legality.is_legal
    assert schedlang_main(["compile", str(path), "-o", str(tmp_path / "train.py")]) == 0


UNEVEN = (0, 64, 256)

# (schedule, [(key the diagnostic points at, words of its message)]) in file order.
REFUSALS = [
    (Features(cuda_graphs=True, sequence=2), [("sequence", "this schedule has mesh.sequence = 2")]),
    (Features(cuda_graphs=True, boundaries=UNEVEN), [("chunks", "chunks of different lengths [64, 192]")]),
    (Features(cuda_graphs="step", sequence=2), [("sequence", "cuda_graphs = step replays captured graphs")]),
    (Features(cuda_graphs=True, recompute="full"), [("recompute", "recompute = full")]),
    (Features(cuda_graphs=True, recompute="mlp"), [("recompute", "this schedule has recompute = mlp")]),
    (Features(cuda_graphs="step", offload=True), [("offload", "this schedule has offload = true")]),
    (Features(cuda_graphs=True, layers=("gla", "attn")), [("layers", "this schedule has attn layers")]),
    (
        Features(
            ("gla", "attn", "gdn", "gla"), sequence=2, boundaries=UNEVEN, cuda_graphs=True, recompute="mixer",
            offload=True,
        ),
        [
            ("layers", "this schedule has attn layers"),
            ("sequence", "this schedule has mesh.sequence = 2"),
            ("chunks", "chunks of different lengths [64, 192]"),
            ("recompute", "recompute = mixer"),
            ("offload", "offload = true"),
        ],
    ),
]
REFUSAL_IDS = [f"refusal-{index}" for index in range(len(REFUSALS))]


@pytest.mark.parametrize("features, expected", REFUSALS, ids=REFUSAL_IDS)
def test_every_refusal_is_a_check_error_at_its_key_all_in_one_run(features, expected, tmp_path, capsys):
    text = features.text()
    path = tmp_path / "refused.sched"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScheduleError) as error:
        load_program(path)
    diagnostics = error.value.diagnostics
    assert len(diagnostics) == len(expected)
    for diagnostic, (key, words) in zip(diagnostics, expected):
        assert words in diagnostic.message
        assert (diagnostic.span.line, diagnostic.span.column) == position_of(text, key), (key, diagnostic)
    assert schedlang_main(["check", str(path)]) == 1
    checked = capsys.readouterr().err
    for command in (["compile", str(path), "-o", str(tmp_path / "train.py")], ["simulate", str(path)]):
        assert schedlang_main(command) == 1
        assert capsys.readouterr().err == checked  # every command refuses with the checker's words
    assert not (tmp_path / "train.py").exists()
    assert f"{path}:{diagnostics[0].span.line}:{diagnostics[0].span.column}: error: " in checked
    if len(diagnostics) > 1:
        assert checked.rstrip().endswith(f"{len(diagnostics)} errors")


def test_every_capability_row_is_reached_by_a_refusal():
    reached = set()
    for features, _ in REFUSALS:
        request = run_request(*features.runtime_records())
        reached |= {index for index, capability in enumerate(CAPABILITIES) if capability.refuses(request)}
    assert reached == set(range(len(CAPABILITIES)))


@pytest.mark.parametrize("features, expected", REFUSALS, ids=REFUSAL_IDS)
def test_the_runtime_refuses_with_the_checker_reasons(features, expected):
    with pytest.raises(ScheduleError) as checked:
        load_program_text(features.text(), "t.sched")
    model, pipeline = features.runtime_records()
    with pytest.raises(UnsupportedRunError) as refused:
        Trainer(model, pipeline, TrainConfig(), mesh=None)
    runtime_reasons = sorted(refusal.message for refusal in refused.value.refusals)
    assert runtime_reasons == sorted(diagnostic.message for diagnostic in checked.value.diagnostics)
    assert len(runtime_reasons) == len(expected)


def test_step_graphs_take_chunks_of_different_lengths():
    """[Note: step graphs] captures every chunk on its own, so uneven chunks need no refusal; per-chunk slots do."""
    assert load_program_text(Features(cuda_graphs="step", boundaries=UNEVEN).text(), "t.sched").n_chunks == 2
    assert not refusals(run_request(*Features(cuda_graphs="step", boundaries=UNEVEN).runtime_records()))
    assert refusals(run_request(*Features(cuda_graphs=True, boundaries=UNEVEN).runtime_records()))


def test_a_supported_schedule_passes_the_runtime_check():
    model, pipeline = Features(layers=("gla", "attn"), cuda_graphs=False).runtime_records()
    assert load_program_text(Features(layers=("gla", "attn")).text(), "t.sched").model.layers[1].value == "attn"
    with pytest.raises(AttributeError):  # past the capabilities check, the trainer reaches for the mesh
        Trainer(model, pipeline, TrainConfig(), mesh=None)


def test_gdn_layers_pass_the_checker_and_the_runtime_check_with_sequence_parallelism():
    features = Features(layers=("gla", "gdn"), sequence=2)
    assert load_program_text(features.text(), "t.sched").mesh.sequence == 2
    model, pipeline = features.runtime_records()
    with pytest.raises(AttributeError):  # past the capabilities check, the trainer reaches for the mesh
        Trainer(model, pipeline, TrainConfig(), mesh=None)


def test_revise_checks_a_variant_like_the_file():
    program = load_program(ROOT / "examples" / "gla_stateflow.sched")
    variant = revise(program, chunks=8, extra_warmup=2)
    assert variant.n_chunks == 8 and variant.pipeline.extra_warmup == 2
    assert variant.model == program.model and variant.mesh == program.mesh
    assert revise(program, **{"pipeline.split_backward": True}).pipeline.split_backward
    assert compile_schedule(variant, through=Pass.LEGALITY).legality.is_legal


def test_revise_rejects_an_illegal_variant_pointing_at_the_revised_key():
    program = load_program(ROOT / "examples" / "simple_gla_gpipe.sched")
    with pytest.raises(ScheduleError) as error:
        revise(program, extra_warmup=2)
    rendered = error.value.render()
    (diagnostic,) = error.value.diagnostics
    assert "extra_warmup" in diagnostic.message and "1f1b" in rendered
    assert "extra_warmup = 2" in rendered.splitlines()[1]  # the revised line, with the caret under it
    parallel = load_program(ROOT / "examples" / "sequence_parallel.sched")
    with pytest.raises(ScheduleError, match="cuda_graphs = true replays captured graphs"):
        revise(parallel, cuda_graphs=True)


def test_revise_refuses_keys_the_language_does_not_have_and_hand_built_programs():
    program = load_program(ROOT / "examples" / "gla_stateflow.sched")
    with pytest.raises(ValueError, match="no key 'warmup'"):
        revise(program, warmup=2)
    with pytest.raises(ValueError, match="mesh and train; name it as block.key"):
        revise(program, data=2)
    with pytest.raises(ValueError, match="built by hand"):
        revise(replace(program, source_text=None), chunks=2)


def test_compile_schedule_stops_after_the_pass_asked_for():
    text = (ROOT / "examples" / "gla_stateflow.sched").read_text(encoding="utf-8")
    checked = compile_schedule(ScheduleText(text, "g.sched"), through=Pass.CHECK)
    assert checked.syntax is not None and checked.program.n_chunks == 4 and checked.orders is None
    placed = compile_schedule(checked.program, through=Pass.PLACEMENT)
    assert placed.legality.is_legal and placed.stage_actions and placed.timeline is None and placed.script is None


def test_the_vocabulary_imports_nothing_heavy_and_nothing_of_ours():
    code = (
        "import sys, schedlang.vocabulary; "
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('torch', 'lark', 'jinja2', 'networkx') "
        "or (name.startswith('schedlang.') and not name.startswith('schedlang.vocabulary'))))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"
