"""Every example loads, means what it says, and survives being re-laid-out."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from schedlang.frontend import load_program, load_program_text
from schedlang.vocabulary.actions import TaskId
from schedlang.vocabulary import DataKind, LayerKind, OptimizerKind, OrderKind, PartitionKind, SequenceParallelMethod

from .helpers import EXAMPLES

EXAMPLE_PATHS = sorted(EXAMPLES.glob("*.sched"))

ISSUE_EXAMPLE = """\
schedule gla_stateflow

model {
  vocab    = 256
  d_model  = 128
  layers   = [gla] * 4
  heads    = 2
  head_dim = 64
  mlp      = swiglu(ratio = 4)
}

mesh {
  pipeline = 2
  sequence = 1
  data     = 1
}

sequence {
  length       = 4096
  chunks       = 4
  partition    = uniform
  kernel_chunk = 64
}

pipeline {
  microbatches = 4
  order        = 1f1b
}

train {
  steps     = 20
  optimizer = adamw(lr = 3e-3)
  dtype     = fp32
  data      = synthetic(seed = 0)
}
"""


def without_spans(program):
    """The program with every source position removed, for comparing layouts."""
    orders = tuple(
        replace(order, span=None, tasks=tuple(replace(token, span=None) for token in order.tasks))
        for order in program.pipeline.explicit_orders
    )
    return replace(program, spans={}, pipeline=replace(program.pipeline, explicit_orders=orders))


def strip_comments(text: str) -> str:
    return re.sub(r"(#|//)[^\n]*", "", text)


def test_default_example_holds_the_issue_text_verbatim():
    text = (EXAMPLES / "gla_stateflow.sched").read_text()
    assert ISSUE_EXAMPLE in text
    program = load_program_text(ISSUE_EXAMPLE, "issue.sched")
    assert program.name == "gla_stateflow"
    assert program.model.layers == (LayerKind.GLA,) * 4
    assert program.sequence.boundaries == (0, 1024, 2048, 3072, 4096)
    assert program.pipeline.order is OrderKind.ONE_F_ONE_B
    assert program.stage_layers == ((0, 1), (2, 3))
    assert program.train.optimizer.lr == pytest.approx(3e-3)
    assert program.spans["pipeline.order"].line == 27
    assert program.spans["train.optimizer.lr"].line == 32


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda path: path.stem)
def test_example_round_trips_through_any_layout(path):
    """Comments, line breaks and indentation carry no meaning: the program is unchanged."""
    program = load_program(path)
    text = path.read_text()
    one_line = " ".join(strip_comments(text).split())
    spread = re.sub(r"([{}\[\](),=])", r"\n\1\n", strip_comments(text))
    for variant in (strip_comments(text), one_line, spread):
        again = load_program_text(variant, str(path))
        assert without_spans(again) == without_spans(program)


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda path: path.stem)
def test_example_spans_point_at_their_keys(path):
    program = load_program(path)
    lines = path.read_text().split("\n")
    for dotted, span in program.spans.items():
        source_line = lines[span.line - 1]
        written = source_line[span.column - 1 :]
        name = dotted.split(".")[-1]
        if dotted.startswith("pipeline.stage."):
            assert written.startswith("stage " + name), (dotted, written)
        elif dotted == "schedule":
            assert written.startswith(program.name)
        else:
            assert written.startswith(name), (dotted, written)


def test_explicit_order_example_keeps_tokens_and_spans():
    program = load_program(EXAMPLES / "explicit_order.sched")
    orders = program.pipeline.explicit_orders
    assert [order.stage for order in orders] == [0, 1]
    assert [str(token.task) for token in orders[1].tasks] == [
        "1F0.0",
        "1F0.1",
        "1B0.1",
        "1B0.0",
        "1F1.0",
        "1F1.1",
        "1B1.1",
        "1B1.0",
    ]
    lines = (EXAMPLES / "explicit_order.sched").read_text().split("\n")
    for order in orders:
        for token in order.tasks:
            written = lines[token.span.line - 1][token.span.column - 1 : token.span.end_column - 1]
            assert written == token.task.local_form()
            assert TaskId.parse(str(token.task)) == token.task


def test_hybrid_example_is_balanced_towards_short_late_chunks():
    program = load_program(EXAMPLES / "hybrid_balanced.sched")
    sequence = program.sequence
    assert sequence.partition is PartitionKind.BALANCED
    assert sequence.balance_alpha == pytest.approx(0.75)
    lengths = [sequence.chunk_length(chunk) for chunk in range(sequence.n_chunks)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]
    assert all(boundary % 64 == 0 for boundary in sequence.boundaries)
    assert program.model.layers == (LayerKind.GLA,) * 3 + (LayerKind.ATTN,) + (LayerKind.GLA,) * 3 + (
        LayerKind.ATTN,
    )


def test_other_examples_values():
    gpipe = load_program(EXAMPLES / "simple_gla_gpipe.sched")
    assert gpipe.sequence.boundaries == (0, 1024, 2560, 4096)
    assert gpipe.sequence.partition is PartitionKind.EXPLICIT
    assert gpipe.pipeline.order is OrderKind.GPIPE
    assert gpipe.train.optimizer.kind is OptimizerKind.SGD
    assert gpipe.train.optimizer.momentum == pytest.approx(0.9)
    assert gpipe.train.grad_clip == pytest.approx(1.0)

    split = load_program(EXAMPLES / "split_mlp_warmup.sched")
    assert split.model.layers == (LayerKind.GLA, LayerKind.MLP) * 3 and split.model.separate_mlp
    assert split.stage_layers == ((0, 1, 2, 3, 4), (5,))
    assert split.pipeline.extra_warmup == 1 and split.pipeline.split_backward

    parallel = load_program(EXAMPLES / "sequence_parallel.sched")
    assert parallel.mesh.sequence == 2 and parallel.mesh.world_size == 4
    assert parallel.sequence.parallel is SequenceParallelMethod.ALLSCAN
    assert parallel.sequence.scan_blocks == 4
    assert all(parallel.sequence.chunk_length(c) % 128 == 0 for c in range(parallel.n_chunks))
    assert parallel.train.checkpoint_directory == "checkpoints/sequence_parallel"
    assert parallel.train.checkpoint_every == 5
    assert parallel.train.data.kind is DataKind.SYNTHETIC


def test_new_feature_examples_values():
    from schedlang.vocabulary import Recompute

    packed = load_program(EXAMPLES / "packed_documents.sched")
    assert packed.train.data.kind is DataKind.BYTES and packed.train.data.document_end == 10
    assert packed.pipeline.recompute == (Recompute.MIXER, Recompute.NONE)
    assert packed.model.layers == (LayerKind.GLA, LayerKind.GLA, LayerKind.ATTN) * 2
    assert packed.model.options.attention.rope_theta == 10000.0

    deltanet = load_program(EXAMPLES / "fla_gated_deltanet.sched")
    assert deltanet.model.layers == (LayerKind.GDN,) * 4 and deltanet.model.options.tie_embeddings
    assert deltanet.model.options.gdn.short_conv_size == 4 and deltanet.model.options.gdn.head_k_dim == 16
    assert deltanet.model.options.gdn.gates.value == "mamba" and deltanet.model.options.gdn.value_heads == 4
    assert deltanet.mesh.pipeline == 2 and deltanet.mesh.sequence == 2
