"""Generated training scripts: golden files for the examples, refusals, literal-only values.

Set SCHEDLANG_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from schedlang.cli import main as schedlang_main
from schedlang.compiler import compile_schedule
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text
from schedlang.lowering.legality import IllegalScheduleError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")
RUNNABLE_EXAMPLES = tuple(sorted(path.stem for path in (ROOT / "examples").glob("*.sched")))


def compiled_script(program) -> str:
    """Every pass after the checker's, through codegen."""
    return compile_schedule(program).script


@pytest.mark.parametrize("name", RUNNABLE_EXAMPLES)
def test_generated_script_matches_golden(name):
    script = compile_schedule(ROOT / "examples" / f"{name}.sched").script
    golden = GOLDEN / f"{name}.train.py"
    if os.environ.get("SCHEDLANG_UPDATE_GOLDEN") == "1":
        golden.write_text(script, encoding="utf-8")
    assert script == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", RUNNABLE_EXAMPLES)
def test_generated_script_is_tidy_python(name):
    script = compile_schedule(ROOT / "examples" / f"{name}.sched").script
    ast.parse(script)
    assert script.endswith("\n") and not script.endswith("\n\n")
    for number, line in enumerate(script.splitlines(), 1):
        assert len(line) <= 120, f"line {number} is {len(line)} characters"
        assert line == line.rstrip(), f"line {number} has trailing whitespace"
    assert "\n\n\n\n" not in script


TINY = """schedule tiny
model {{ vocab = 256  d_model = 32  heads = 2  head_dim = 16  layers = {layers} }}
mesh {{ pipeline = 2  sequence = {sequence} }}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2  order = {order} }}
train {{ steps = 2  data = {data} }}
"""


def tiny(layers="[gla] * 2", sequence=1, order="1f1b", data="synthetic(seed = 0)", extra=""):
    return TINY.format(layers=layers, sequence=sequence, order=order, data=data) + extra


def test_user_strings_appear_only_as_literals(tmp_path):
    hostile = "x\'\'\'); import os; os.system(\'true\') #"
    program = load_program_text(tiny(data=f'bytes(path = "{hostile}")'), "t.sched")
    script = compiled_script(program)
    tree = ast.parse(script)
    assigned = {
        node.targets[0].id: node.value for node in tree.body if isinstance(node, ast.Assign) and len(node.targets) == 1
    }
    data_call = next(keyword.value for keyword in assigned["TRAIN"].keywords if keyword.arg == "data")
    path = next(keyword.value for keyword in data_call.keywords if keyword.arg == "path")
    assert isinstance(path, ast.Constant) and path.value.endswith(program.train.data.path)
    assert not any(isinstance(node, ast.Import) and node.names[0].name == "os" for node in tree.body)


def test_gdn_layers_compile_into_the_model_config():
    script = compiled_script(load_program_text(tiny(layers="[gla, gdn]"), "t.sched"))
    assert "layers=('gla', 'gdn')," in script


def test_sequence_parallel_gdn_compiles():
    script = compiled_script(load_program_text(tiny(layers="[gla, gdn]", sequence=2), "t.sched"))
    assert "layers=('gla', 'gdn')," in script and "    sequence_parallel=2,\n" in script


def test_sequence_parallel_attention_compiles():
    script = compiled_script(load_program_text(tiny(layers="[gla, attn]", sequence=2), "t.sched"))
    assert "MESH_SHAPE = (2, 2, 1)" in script and "layers=('gla', 'attn')," in script


def pipeline_arguments(script: str) -> dict[str, object]:
    """The keyword arguments of the script's ``PIPELINE = PipelineConfig(...)``, literals evaluated (the stage
    actions, which name the script's STAGE_<r>_ACTIONS, left out)."""
    tree = ast.parse(script)
    call = next(node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "PIPELINE")
    return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg != "stage_actions"}


def test_sequence_parallel_mesh_reaches_the_pipeline_config():
    script = compiled_script(load_program_text(tiny(sequence=2), "t.sched"))
    assert "MESH_SHAPE = (2, 2, 1)" in script
    arguments = pipeline_arguments(script)
    assert arguments["sequence_parallel"] == 2
    assert "sequence_method" not in arguments and "scan_blocks" not in arguments  # allscan(blocks = 1), the default
    blocks = tiny(sequence=2).replace("kernel_chunk = 16", "kernel_chunk = 16  parallel = allscan(blocks = 2)")
    assert pipeline_arguments(compiled_script(load_program_text(blocks, "t.sched")))["scan_blocks"] == 2
    ring = tiny(sequence=2).replace("kernel_chunk = 16", "kernel_chunk = 16  parallel = ring")
    assert pipeline_arguments(compiled_script(load_program_text(ring, "t.sched")))["sequence_method"] == "ring"


ILLEGAL_ORDER = """
  stage 0: F0.0 F0.1 F1.0 F1.1 B0.0 B0.1 B1.1 B1.0
  stage 1: F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0
"""


def test_illegal_schedule_is_refused_with_the_legality_report(tmp_path, capsys):
    text = tiny(order="explicit").replace("order = explicit }", "order = explicit" + ILLEGAL_ORDER + "}")
    program = load_program_text(text, "t.sched")
    with pytest.raises(IllegalScheduleError):
        compiled_script(program)
    schedule = tmp_path / "illegal.sched"
    schedule.write_text(text, encoding="utf-8")
    output = tmp_path / "train.py"
    assert schedlang_main(["compile", str(schedule), "-o", str(output)]) == 1
    error = capsys.readouterr().err
    assert "B0.0" in error and "illegal.sched:" in error and "nothing was generated" in error
    assert not output.exists()


def test_compile_command_writes_the_script(tmp_path):
    output = tmp_path / "train.py"
    assert schedlang_main(["compile", str(ROOT / "examples" / "gla_stateflow.sched"), "-o", str(output)]) == 0
    assert output.read_text(encoding="utf-8") == (GOLDEN / "gla_stateflow.train.py").read_text(encoding="utf-8")


def test_unsupported_schedule_is_a_positioned_compile_error(tmp_path, capsys):
    schedule = tmp_path / "graphs.sched"
    schedule.write_text(with_graphs(tiny(sequence=2)), encoding="utf-8")
    assert schedlang_main(["compile", str(schedule), "-o", str(tmp_path / "train.py")]) == 1
    error = capsys.readouterr().err
    assert f"{schedule}:3:" in error and "error: pipeline.cuda_graphs = true replays" in error and "^" in error


def with_graphs(text: str, pipeline_extra: str = "", chunks: str = "2") -> str:
    graphs = "pipeline { cuda_graphs = true " + pipeline_extra + " microbatches = 2"
    return text.replace("pipeline { microbatches = 2", graphs).replace("chunks = 2", f"chunks = {chunks}")


def test_cuda_graphs_reach_the_pipeline_config():
    script = compiled_script(load_program_text(with_graphs(tiny()), "t.sched"))
    assert pipeline_arguments(script)["cuda_graphs"] == "true"
    plain = compiled_script(load_program_text(tiny(), "t.sched"))
    assert "cuda_graphs" not in plain


def _compute_actions(script: str) -> list[list[str]]:
    """The F and B actions of each STAGE_r_ACTIONS literal of a generated script, stage by stage."""
    stages = {}
    for node in ast.parse(script).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "").startswith("STAGE_"):
            stages[node.targets[0].id] = [action for action in ast.literal_eval(node.value) if action[0] in "FB"]
    return [stages[f"STAGE_{r}_ACTIONS"] for r in range(len(stages))]


def test_extra_warmup_reaches_the_stage_action_lists():
    """Stage 0 of gla_stateflow (4 chunks, 2 stages) runs 4 + 1 + 2 forwards before its first backward."""
    source = (ROOT / "examples" / "gla_stateflow.sched").read_text()
    text = source.replace("order        = 1f1b", "order        = 1f1b  extra_warmup = 2")
    assert text != source
    script = compiled_script(load_program_text(text, "warm.sched"))
    assert "1f1b order with 2 extra warm-up forwards" in script
    warmed, plain = _compute_actions(script), _compute_actions(compiled_script(load_program_text(source, "p.sched")))
    assert [action[0] for action in warmed[0][:8]] == ["F"] * 7 + ["B"]
    assert [action[0] for action in plain[0][:6]] == ["F"] * 5 + ["B"]
    assert warmed[1] == plain[1]  # the last stage keeps its order
    assert sorted(warmed[0]) == sorted(plain[0])
    listed = compiled_script(load_program_text(text.replace("extra_warmup = 2", "extra_warmup = [2, 0]"), "l.sched"))
    assert "1f1b order with [2, 0] extra warm-up forwards per stage" in listed
    assert _compute_actions(listed) == warmed


@pytest.mark.parametrize(
    "text, key, message",
    [
        (with_graphs(tiny(), chunks="[0, 16, 64]"), "chunks", "chunks of different lengths [16, 48]"),
        (with_graphs(tiny(), pipeline_extra="recompute = full"), "recompute", "recompute = full"),
        (with_graphs(tiny(sequence=2)), "sequence = 2", "mesh.sequence = 2"),
        (with_graphs(tiny(layers="[gla, attn]")), "layers", "attn layers"),
    ],
    ids=["uneven-chunks", "recompute", "sequence-parallel", "attention"],
)
def test_cuda_graphs_refusals_point_at_the_key_that_breaks_them(text, key, message):
    with pytest.raises(ScheduleError, match="cuda_graphs = true replays") as error:
        load_program_text(text, "t.sched")
    (diagnostic,) = error.value.diagnostics
    assert message in diagnostic.message
    line = text.splitlines()[diagnostic.span.line - 1]
    assert line[diagnostic.span.column - 1 :].startswith(key.split()[0]), (line, diagnostic.span)
