"""One test per semantic diagnostic, each with its exact line, column and message.

Each case edits lines of the valid schedule ``VALID`` and names the text the
caret must start at on the reported line (its first occurrence, or the
``nth`` one), so the expected column is that token's column.
"""

import pytest

from .helpers import VALID, diagnostics_of, replace_line


def edited(edits: dict[int, str], append: str = "") -> str:
    text = VALID
    for line, new in edits.items():
        text = replace_line(text, line, new)
    return text + append


def column_of(text: str, line: int, token: str, nth: int = 1) -> int:
    source_line = text.split("\n")[line - 1]
    position = -1
    for _ in range(nth):
        position = source_line.index(token, position + 1)
    return position + 1


# name: (edits, appended text, line, token, message)
CASES = {
    "no_header": ({1: ""}, "", 1, "", "the file does not start with 'schedule NAME'"),
    "unknown_block": ({}, "trian { }\n", 24, "trian", "unknown block 'trian' (expected one of model, mesh, sequence, pipeline, train)"),
    "duplicate_block": ({}, "mesh { data = 1 }\n", 24, "mesh", "duplicate block 'mesh' (first written at line 9)"),
    "stage_line_outside_pipeline": ({10: "  stage 0: F0.0"}, "", 10, "stage", "'stage' lines belong in the pipeline block, not in 'mesh'"),
    "missing_block": ({12: "", 13: "", 14: "", 15: "", 16: ""}, "", 1, "schedule", "missing block 'sequence'"),
    "missing_required_key": ({3: ""}, "", 2, "model", "block 'model' is missing required key 'vocab'"),
    "unknown_key": ({7: "  head_dim = 64  hedas = 2"}, "", 7, "hedas", "unknown key 'hedas' in block 'model'"),
    "duplicate_key": ({8: "  heads = 4 }"}, "", 8, "heads", "duplicate key 'model.heads' (first set at line 6)"),
    "not_an_integer": ({4: "  d_model  = 12.5"}, "", 4, "12.5", "'model.d_model' must be an integer, found '12.5'"),
    "below_minimum": ({18: "  microbatches = 0"}, "", 18, "0", "'pipeline.microbatches' must be >= 1, found 0"),
    "above_maximum": ({7: "  head_dim = 2048"}, "", 7, "2048", "'model.head_dim' must be <= 1024, found 2048"),
    "not_a_number": ({22: '  optimizer = adamw(lr = "fast")'}, "", 22, '"fast"', "'train.optimizer.lr' must be a number, found '\"fast\"'"),
    "not_finite": ({22: "  grad_clip = 1e999"}, "", 22, "1e999", "'train.grad_clip' must be a finite number, found '1e999'"),
    "not_positive": ({22: "  optimizer = adamw(lr = 0)"}, "", 22, "0", "'train.optimizer.lr' must be > 0, found 0"),
    "not_below": ({22: "  optimizer = sgd(lr = 0.1, momentum = 1.5)"}, "", 22, "1.5", "'train.optimizer.momentum' must be < 1, found 1.5"),
    "choice_of_wrong_type": ({19: "  order = 3"}, "", 19, "3", "'pipeline.order' must be one of gpipe, 1f1b or explicit, found '3'"),
    "unknown_choice": ({22: "  dtype = fp33"}, "", 22, "fp33", "unknown dtype 'fp33'"),
    "unknown_graph_mode": ({19: "  cuda_graphs = yes"}, "", 19, "yes", "unknown CUDA-graph mode 'yes'"),
    "negative_extra_warmup": ({19: "  extra_warmup = -1"}, "", 19, "-1", "'pipeline.extra_warmup' must be >= 0, found -1"),
    "recompute_per_stage_length": ({19: "  recompute = [full, mlp, none]"}, "", 19, "recompute", "'pipeline.recompute' lists 3 modes but mesh.pipeline = 2"),
    "recompute_per_stage_unknown_mode": ({19: "  recompute = [full, mixr]"}, "", 19, "mixr", "unknown recompute mode 'mixr'"),
    "recompute_per_stage_empty": ({19: "  recompute = []"}, "", 19, "[]", "'pipeline.recompute' lists no mode"),
    "offload_with_full_on_a_stage": ({19: "  recompute = [full, mlp]  offload = true"}, "", 19, "offload", "'pipeline.offload' keeps the activations a chunk's forward saves in host memory, but recompute = full on a stage saves none (its backward reruns the forward)"),
    "extra_warmup_per_stage_length": ({19: "  extra_warmup = [1, 2, 0]"}, "", 19, "[1, 2, 0]", "'pipeline.extra_warmup' lists 3 counts but mesh.pipeline = 2"),
    "extra_warmup_last_stage": ({19: "  extra_warmup = [1, 2]"}, "", 19, "2", "the last stage's extra warm-up must be 0 (its first backward waits on nothing downstream), found 2"),
    "extra_warmup_negative_entry": ({19: "  extra_warmup = [-1, 0]"}, "", 19, "-1", "'an entry of pipeline.extra_warmup' must be >= 0, found -1"),
    "extra_warmup_rises_by_two": ({5: "  layers   = [gla] * 6", 10: "  pipeline = 3", 19: "  extra_warmup = [0, 2, 0]"}, "", 19, "2", "stage 1's extra warm-up 2 exceeds stage 0's (0) by more than 1: it would wait for forwards that stage never sends before its own first backward"),
    "extra_warmup_without_1f1b": ({19: "  order = gpipe  extra_warmup = 2"}, "", 19, "extra_warmup", "'pipeline.extra_warmup' only applies to order = 1f1b, but order = gpipe"),
    "call_of_wrong_type": ({22: "  optimizer = 3"}, "", 22, "3", "'train.optimizer' must be a optimizer (adamw, sgd), found '3'"),
    "unknown_call": ({22: "  optimizer = adam(lr = 1)"}, "", 22, "adam", "unknown optimizer 'adam'"),
    "tokens_without_path": ({22: "  data = tokens(dtype = uint32)"}, "", 22, "tokens", "tokens data needs the file of token ids"),
    "text_without_tokenizer": ({22: '  data = text(path = "c.txt")'}, "", 22, "text", "text data needs the text file and the tokenizer"),
    "unknown_token_dtype": ({22: '  data = tokens(path = "t.bin", dtype = int8)'}, "", 22, "int8", "unknown token dtype 'int8'"),
    "validation_not_below_one": ({22: "  data = bytes(validation = 1)"}, "", 22, "1", "'train.data.validation' must be < 1, found 1"),
    "eval_without_held_out_data": ({22: "  eval_every = 10  data = bytes()"}, "", 22, "10", "'train.eval_every' = 10 evaluates on held-out data, but train.data holds none"),
    "unknown_lr_schedule": ({22: "  lr_schedule = cosin"}, "", 22, "cosin", "unknown learning-rate schedule 'cosin'"),
    "negative_warmup": ({22: "  lr_schedule = cosine(warmup = -1)"}, "", 22, "-1", "'train.lr_schedule.warmup' must be >= 0, found -1"),
    "warmup_past_the_run": ({22: "  steps = 5  lr_schedule = cosine(warmup = 5)"}, "", 22, "cosine", "the learning-rate warm-up of 5 steps does not end within train.steps = 5"),
    "min_lr_above_lr": ({22: "  lr_schedule = linear(min_lr = 0.5)"}, "", 22, "linear", "min_lr = 0.5 is above the optimizer's lr = 0.001: the schedule decays from lr down to min_lr"),
    "unknown_argument": ({22: "  optimizer = adamw(rl = 1)"}, "", 22, "rl", "unknown argument 'rl' of adamw"),
    "duplicate_argument": ({22: "  optimizer = adamw(lr = 1, lr = 2)"}, "", 22, "lr", "duplicate argument 'lr' of adamw", 2),
    "every_outside_checkpoint": ({22: "  steps = 5 every 2"}, "", 22, "5", "'every' is only allowed in train.checkpoint"),
    "every_in_a_call_valued_key": ({15: "  kernel_chunk = 64  parallel = ring every 2"}, "", 15, "ring", "'every' is only allowed in train.checkpoint"),
    "layers_not_a_list": ({5: "  layers = gla"}, "", 5, "gla", "'model.layers' must be a list of layer kinds such as [gla] * 4, found 'gla'"),
    "layers_empty": ({5: "  layers = []"}, "", 5, "[]", "'model.layers' is empty; a model needs at least one layer"),
    "unknown_layer_kind": ({5: "  layers = [gla, glaa] * 2"}, "", 5, "glaa", "unknown layer kind 'glaa'"),
    "too_many_layers": ({5: "  layers = [gla] * 100000"}, "", 5, "[gla]", "'model.layers' has more than 4096 layers"),
    "layer_not_a_name": ({5: "  layers = [gla, 3]"}, "", 5, "3", "expected a layer kind, found '3'"),
    "repeat_count_zero": ({5: "  layers = [gla] * 0"}, "", 5, "0", "'the repeat count of model.layers' must be >= 1, found 0"),
    "mlp_layers_without_mlp": ({5: "  layers = [gla, mlp] * 2", 7: "  head_dim = 64  mlp = none"}, "", 7, "mlp", "'model.layers' names mlp layers, but model.mlp = none gives them nothing to run"),
    "mlp_ratio": ({7: "  head_dim = 64  mlp = swiglu(ratio = 0)"}, "", 7, "0", "'model.mlp.ratio' must be > 0, found 0"),
    "stages_shape": ({7: "  head_dim = 64  stages = [0, 1]"}, "", 7, "[0, 1]", "'model.stages' must be a list of layer-index lists, one per stage, e.g. [[0, 1], [2, 3]]"),
    "too_few_layers_for_stages": ({10: "  pipeline = 8"}, "", 10, "pipeline", "4 layers cannot fill 8 pipeline stages: each stage needs at least one layer"),
    "layers_do_not_divide_stages": ({10: "  pipeline = 3"}, "", 5, "layers", "4 layers do not divide evenly over 3 pipeline stages"),
    "stages_count": ({7: "  head_dim = 64  stages = [[0, 1, 2, 3]]"}, "", 7, "stages", "'model.stages' lists 1 stages but mesh.pipeline = 2"),
    "stage_without_layers": ({7: "  head_dim = 64  stages = [[0, 1, 2, 3], []]"}, "", 7, "[]", "stage 1 has no layers in 'model.stages'"),
    "stage_not_contiguous": ({7: "  head_dim = 64  stages = [[0, 2, 1], [3]]"}, "", 7, "[0, 2, 1]", "stage 0 of 'model.stages' must hold the next contiguous layers [0, 1, 2], found [0, 2, 1]"),
    "stages_do_not_cover": ({7: "  head_dim = 64  stages = [[0], [1, 2]]"}, "", 7, "stages", "'model.stages' assigns 3 layers but the model has 4"),
    "kernel_chunk_power_of_two": ({15: "  kernel_chunk = 48"}, "", 15, "48", "'sequence.kernel_chunk' must be a power of two, found 48"),
    "alpha_too_large": ({15: "  kernel_chunk = 64  partition = balanced(alpha = 9)"}, "", 15, "9", "'alpha' must be <= 4, found 9"),
    "negative_alpha": ({15: "  kernel_chunk = 64  partition = balanced(alpha = -1)"}, "", 15, "-1", "'sequence.partition.alpha' must be >= 0, found -1"),
    "scan_blocks_divide_head_dim": ({15: "  kernel_chunk = 64  parallel = allscan(blocks = 3)"}, "", 15, "3", "allscan blocks = 3 does not divide head_dim = 64"),
    "partition_with_boundary_list": ({14: "  chunks = [0, 2048, 4096]  partition = uniform"}, "", 14, "uniform", "partition = uniform computes the boundaries, but 'sequence.chunks' lists them"),
    "explicit_partition_without_list": ({14: "  chunks = 4  partition = explicit"}, "", 14, "explicit", "partition = explicit needs 'sequence.chunks' to list the boundaries"),
    "sequence_parallel_length": ({10: "  pipeline = 2  sequence = 4", 13: "  length = 4160"}, "", 13, "4160", "with mesh.sequence = 4 the length must be a multiple of 4 * kernel_chunk = 256, found 4160"),
    "too_many_chunks": ({14: "  chunks = 100"}, "", 14, "100", "'sequence.chunks' = 100 does not fit: cannot cut 4096 tokens into 100 chunks of whole 64-token kernel chunks: at most 64 chunks fit"),
    "one_boundary": ({14: "  chunks = [4096]"}, "", 14, "[4096]", "'sequence.chunks' must list at least two boundaries, 0 and the length"),
    "first_boundary": ({14: "  chunks = [64, 2048, 4096]"}, "", 14, "64", "the first chunk boundary must be 0, found 64"),
    "last_boundary": ({14: "  chunks = [0, 2048, 4000]"}, "", 14, "4000", "the last chunk boundary must be the sequence length 4096, found 4000"),
    "boundaries_increase": ({14: "  chunks = [0, 2048, 1024, 4096]"}, "", 14, "1024", "chunk boundaries must increase: 1024 follows 2048"),
    "boundary_multiple": ({14: "  chunks = [0, 1000, 4096]"}, "", 14, "1000", "chunk boundary 1000 is not a multiple of 64 (kernel_chunk = 64)"),
    "boundary_multiple_sequence_parallel": ({10: "  pipeline = 2  sequence = 2", 14: "  chunks = [0, 1088, 4096]"}, "", 14, "1088", "chunk boundary 1088 is not a multiple of 128 (mesh.sequence * kernel_chunk = 2 * 64)"),
    "negative_boundary": ({14: "  chunks = [0, -64, 4096]"}, "", 14, "-64", "'a boundary in sequence.chunks' must be >= 0, found -64"),
    "explicit_without_stage_lines": ({19: "  order = explicit"}, "", 19, "order", "order = explicit needs one 'stage r:' line per stage"),
    "stage_lines_without_explicit": ({19: "  order = gpipe  stage 0: F0.0"}, "", 19, "stage", "'stage' lines are only allowed with order = explicit, but order = gpipe"),
    "stage_out_of_range": ({19: "  order = explicit  stage 0: F0.0  stage 1: F0.0  stage 2: F0.0"}, "", 19, "2", "stage 2 does not exist (stages are 0 to 1, mesh.pipeline = 2)"),
    "stage_twice": ({19: "  order = explicit  stage 0: F0.0  stage 1: F0.0  stage 0: F1.0"}, "", 19, "0: F1.0", "stage 0 has two order lines (first at line 19)"),
    "stage_missing": ({19: "  order = explicit  stage 1: F0.0"}, "", 19, "order", "order = explicit but no 'stage' line for stage 0"),
    "word_not_a_task": ({19: "  order = explicit  stage 0: F0.0  stage 1: X0.1"}, "", 19, "X0.1", "'X0.1' is not a task"),
    "microbatch_out_of_range": ({19: "  order = explicit  stage 0: F0.0  stage 1: F4.0"}, "", 19, "F4.0", "task F4.0 names microbatch 4, but pipeline.microbatches = 4"),
    "chunk_out_of_range": ({19: "  order = explicit  stage 0: F0.0  stage 1: B0.4"}, "", 19, "B0.4", "task B0.4 names chunk 4, but the sequence has 4 chunks"),
    "weight_task_without_split_backward": ({19: "  order = explicit  stage 0: F0.0  stage 1: W0.0"}, "", 19, "W0.0", "task W0.0 is a weight-gradient task, but the backward is not split"),
    "split_backward_not_a_boolean": ({18: "  microbatches = 4  split_backward = 1"}, "", 18, "1", "'pipeline.split_backward' must be true or false, found '1'"),
    "forward_before_weight_without_split": ({19: "  forward_before_weight = true"}, "", 19, "forward_before_weight", "'pipeline.forward_before_weight' places W tasks, but split_backward is not true"),
    "deferred_weights_without_1f1b": ({19: "  order = gpipe  split_backward = true  extra_deferred_weights = 2"}, "", 19, "extra_deferred_weights", "'pipeline.extra_deferred_weights' only applies to order = 1f1b, but order = gpipe"),
    "negative_deferred_weights": ({19: "  split_backward = true  extra_deferred_weights = -2"}, "", 19, "-2", "'pipeline.extra_deferred_weights' must be >= 0, found -2"),
    "betas_shape": ({22: "  optimizer = adamw(betas = [0.9])"}, "", 22, "[0.9]", "'train.optimizer.betas' must be a list of two numbers, e.g. [0.9, 0.95]"),
    "beta_range": ({22: "  optimizer = adamw(betas = [0.9, 1.0])"}, "", 22, "1.0", "'train.optimizer.betas' must be < 1, found 1.0"),
    "data_path": ({22: "  data = bytes(path = 3)"}, "", 22, "3", "'train.data.path' must be a non-empty string such as \"data.txt\""),
    "data_seed": ({22: "  data = synthetic(seed = -1)"}, "", 22, "-1", "'train.data.seed' must be >= 0, found -1"),
    "checkpoint_without_every": ({22: '  checkpoint = "ckpt"'}, "", 22, '"ckpt"', "'train.checkpoint' must be a directory and an interval, found '\"ckpt\"'"),
    "checkpoint_directory": ({22: "  checkpoint = 5 every 5"}, "", 22, "5", "the checkpoint directory must be a non-empty string, e.g. \"checkpoints\""),
    "checkpoint_every": ({22: '  checkpoint = "ckpt" every 0'}, "", 22, "0", "'train.checkpoint every' must be >= 1, found 0"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_semantic_diagnostic(name):
    edits, append, line, token, message, *nth = CASES[name]
    text = edited(edits, append)
    found = diagnostics_of(text)
    expected = (line, column_of(text, line, token, *nth) if token else 1, message)
    assert found == [expected]


def test_every_error_is_reported_in_file_order():
    text = edited(
        {
            4: "  d_model  = 12.5",
            5: "  layers   = [gla, glaa]",
            7: "  head_dmi = 64",
            14: "  chunks = [0, 1000, 900, 4096]",
            19: "  order = 1f1c",
            22: "  dtype = fp33",
        },
        "trian { }\n",
    )
    found = diagnostics_of(text)
    assert [(line, message) for line, _, message in found] == [
        (2, "block 'model' is missing required key 'head_dim'"),
        (4, "'model.d_model' must be an integer, found '12.5'"),
        (5, "unknown layer kind 'glaa'"),
        (7, "unknown key 'head_dmi' in block 'model'"),
        (14, "chunk boundary 1000 is not a multiple of 64 (kernel_chunk = 64)"),
        (14, "chunk boundaries must increase: 900 follows 1000"),
        (14, "chunk boundary 900 is not a multiple of 64 (kernel_chunk = 64)"),
        (19, "unknown pipeline order '1f1c'"),
        (22, "unknown dtype 'fp33'"),
        (24, "unknown block 'trian' (expected one of model, mesh, sequence, pipeline, train)"),
    ]


def test_did_you_mean_hints():
    from schedlang.diagnostics import ScheduleError
    from schedlang.frontend import load_program_text

    text = edited({7: "  head_dmi = 64", 19: "  order = 1f1c"})
    with pytest.raises(ScheduleError) as raised:
        load_program_text(text, "t.sched")
    hints = [diagnostic.hint for diagnostic in raised.value.diagnostics]
    assert "did you mean 'head_dim'?" in hints
    assert "did you mean '1f1b'? (expected one of gpipe, 1f1b, explicit)" in hints
    assert "add e.g. `head_dim = 64`" in hints


def test_chunks_are_not_read_when_the_length_cannot_be_shared():
    """A refused length settles the boundaries: the chunk count's own problem is not reported on top."""
    text = edited({10: "  pipeline = 2  sequence = 4", 13: "  length = 4160", 14: "  chunks = 0"})
    assert [message for _, _, message in diagnostics_of(text)] == [
        "with mesh.sequence = 4 the length must be a multiple of 4 * kernel_chunk = 256, found 4160"
    ]
