"""Single-process tests of the runtime pieces: actions, placement, model, data, state store."""

from __future__ import annotations

import itertools

import pytest
import torch

from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders
from schedlang.lowering.placement import place_stage_actions
from schedlang.vocabulary.actions import TaskId
from schedlang.runtime.data import RECALL_PERIOD, TokenSource, default_corpus_files
from schedlang.runtime.model import build_stage_model
from schedlang.runtime.state_store import StateStore
from schedlang.vocabulary import Action, ActionKind, DataConfig, DataKind, LayerKind, ModelConfig

MODEL = ModelConfig(
    vocab=64, d_model=32, layers=(LayerKind.GLA, LayerKind.SIMPLE_GLA, LayerKind.GLA), heads=2, head_dim=16, mlp_ratio=2.0
)


def test_action_text_round_trips():
    for kind in ActionKind:
        action = Action(kind, 3, 12)
        assert Action.parse(str(action)) == action
    with pytest.raises(ValueError, match="not a pipeline action"):
        Action.parse("SEND_X0.1")


def simulate_blocking_receives(stage_actions):
    """Run action lists with asynchronous sends and blocking FIFO receives; return the stuck ranks (if any)."""
    n_stages = len(stage_actions)
    channels = {}
    positions = [0] * n_stages
    progress = True
    while progress:
        progress = False
        for stage, actions in enumerate(stage_actions):
            while positions[stage] < len(actions):
                kind, microbatch, chunk = actions[positions[stage]]
                if kind is ActionKind.SEND_ACTIVATION:
                    channels.setdefault((stage, stage + 1), []).append((microbatch, chunk))
                elif kind is ActionKind.SEND_GRADIENT:
                    channels.setdefault((stage, stage - 1), []).append((microbatch, chunk))
                elif kind in (ActionKind.RECV_ACTIVATION, ActionKind.RECV_GRADIENT):
                    source = stage - 1 if kind is ActionKind.RECV_ACTIVATION else stage + 1
                    queue = channels.get((source, stage), [])
                    if not queue:
                        break
                    assert queue.pop(0) == (microbatch, chunk), "FIFO receive matched the wrong message"
                positions[stage] += 1
                progress = True
    return [stage for stage in range(n_stages) if positions[stage] < len(stage_actions[stage])]


@pytest.mark.parametrize(
    "n_stages,n_microbatches,n_chunks", list(itertools.product((1, 2, 3, 4), (1, 2, 5), (1, 2, 3)))
)
@pytest.mark.parametrize("orders", [gpipe_orders, one_f_one_b_orders], ids=["gpipe", "1f1b"])
def test_placement_of_generated_orders_never_deadlocks(orders, n_stages, n_microbatches, n_chunks):
    placed = place_stage_actions(orders(n_stages, n_microbatches, n_chunks))
    assert simulate_blocking_receives(placed) == []
    for stage, actions in enumerate(placed):
        kinds = [action.kind for action in actions]
        units = n_microbatches * n_chunks
        assert kinds.count(ActionKind.RECV_ACTIVATION) == (units if stage > 0 else 0)
        assert kinds.count(ActionKind.SEND_GRADIENT) == (units if stage > 0 else 0)
        assert kinds.count(ActionKind.SEND_ACTIVATION) == (units if stage < n_stages - 1 else 0)
        assert kinds.count(ActionKind.RECV_GRADIENT) == (units if stage < n_stages - 1 else 0)


def test_placement_receives_in_the_senders_order():
    forward, backward = TaskId.forward, TaskId.backward
    stage0 = (forward(0, 0, 0), forward(0, 1, 0), backward(0, 0, 0), backward(0, 1, 0))
    stage1 = (forward(1, 1, 0), backward(1, 1, 0), forward(1, 0, 0), backward(1, 0, 0))
    placed = place_stage_actions((stage0, stage1))
    assert [str(action) for action in placed[1]] == [
        "RECV_F0.0", "RECV_F1.0", "F1.0", "B1.0", "SEND_B1.0", "F0.0", "B0.0", "SEND_B0.0",
    ]
    # Stage 0 must take B1.0's gradient before B0.0 needs B0.0's: it arrives first.
    assert [str(action) for action in placed[0]][4:] == ["RECV_B1.0", "RECV_B0.0", "B0.0", "B1.0"]
    assert simulate_blocking_receives(placed) == []


def test_stage_split_does_not_change_initial_weights():
    whole = build_stage_model(MODEL, (0, 1, 2), True, True, 11, torch.device("cpu"), torch.float32)
    first = build_stage_model(MODEL, (0,), True, False, 11, torch.device("cpu"), torch.float32)
    last = build_stage_model(MODEL, (1, 2), False, True, 11, torch.device("cpu"), torch.float32)
    split = {**dict(first.named_parameters()), **dict(last.named_parameters())}
    assert sorted(split) == sorted(dict(whole.named_parameters()))
    for name, parameter in whole.named_parameters():
        assert torch.equal(parameter, split[name]), name
    other_seed = build_stage_model(MODEL, (0,), True, False, 12, torch.device("cpu"), torch.float32)
    assert not torch.equal(other_seed.embedding.weight, first.embedding.weight)


def test_separate_mlp_layers_compute_the_blocks_network():
    """[gla, mlp, simple_gla, mlp] with the weights of [gla, simple_gla] (mixers and MLPs moved to their layers)
    gives the same outputs, states and gradients, chunked or whole; mlp layers keep no state."""
    blocks = ModelConfig(vocab=64, d_model=32, layers=("gla", "simple_gla"), heads=2, head_dim=16, mlp_ratio=2.0)
    split = ModelConfig(vocab=64, d_model=32, layers=("gla", "mlp", "simple_gla", "mlp"), heads=2, head_dim=16,
                        mlp_ratio=2.0)
    assert blocks.init_depth == split.init_depth == 4
    whole = build_stage_model(blocks, (0, 1), True, True, 5, torch.device("cpu"), torch.float64)
    first = build_stage_model(split, (0, 1, 2), True, False, 5, torch.device("cpu"), torch.float64)
    last = build_stage_model(split, (3,), False, True, 5, torch.device("cpu"), torch.float64)
    assert first.layers["1"].mixer is None and first.layers["0"].mlp is None
    renamed = {}
    for name, value in whole.state_dict().items():
        parts = name.split(".")
        if parts[0] == "layers":
            layer = 2 * int(parts[1]) + (parts[2].startswith("mlp"))
            parts[1] = str(layer)
        renamed[".".join(parts)] = value
    first.load_state_dict({k: v for k, v in renamed.items() if k in first.state_dict()}, strict=True)
    last.load_state_dict({k: v for k, v in renamed.items() if k in last.state_dict()}, strict=True)
    tokens = torch.randint(0, 64, (2, 48))
    expected, expected_states = whole(tokens, [None, None])
    states = [None] * 3
    pieces = []
    for start, end in ((0, 16), (16, 48)):
        hidden, states = first(tokens[:, start:end], states)
        assert states[1] is None
        hidden, _ = last(hidden, [None])
        pieces.append(hidden)
    torch.testing.assert_close(torch.cat(pieces, 1), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(states[0], expected_states[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(states[2], expected_states[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("d_model, ratio, width", [(2048, 8 / 3, 5464), (32, 2.0, 64), (100, 1.0, 104), (3, 1.0, 8)])
def test_swiglu_width_is_rounded_up_to_aligned_rows(d_model, ratio, width):
    config = ModelConfig(vocab=16, d_model=d_model, layers=(LayerKind.GLA,), heads=1, head_dim=8, mlp_ratio=ratio)
    block = build_stage_model(config, (0,), True, True, 0, torch.device("cpu"), torch.float32).layers["0"]
    assert block.mlp.gate_up_proj.weight.shape == (2 * width, d_model)
    assert block.mlp.down_proj.weight.shape == (d_model, width)


def test_chunked_forward_with_state_hand_off_equals_the_whole_sequence():
    torch.manual_seed(0)
    model = build_stage_model(MODEL, (0, 1, 2), True, True, 3, torch.device("cpu"), torch.float64)
    tokens = torch.randint(0, MODEL.vocab, (2, 96))
    whole, whole_states = model(tokens, [None] * 3)
    pieces, states = [], [None] * 3
    for start, end in ((0, 16), (16, 80), (80, 96)):
        hidden, states = model(tokens[:, start:end], states)
        pieces.append(hidden)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-10, atol=1e-10)
    for state, whole_state in zip(states, whole_states):
        torch.testing.assert_close(state, whole_state, rtol=1e-10, atol=1e-10)
    dropped, _ = model(tokens[:, 16:80], [None] * 3)
    assert not torch.allclose(dropped, whole[:, 16:80], atol=1e-6)


def test_synthetic_data_is_deterministic_and_needs_recall():
    source = TokenSource(DataConfig(DataKind.SYNTHETIC, seed=4), vocab=64, length=100, global_batch=6)
    batch = source.global_batch_tokens(3)
    assert batch.shape == (6, 101)
    assert torch.equal(batch, source.global_batch_tokens(3))
    assert not torch.equal(batch, source.global_batch_tokens(4))
    assert torch.equal(batch[:, RECALL_PERIOD:], batch[:, :-RECALL_PERIOD])
    assert torch.equal(source.replica_tokens(3, 1, 3), batch[3:6])


def test_bytes_data_reads_the_standard_library_deterministically():
    files = default_corpus_files()
    assert files and files == sorted(files)
    source = TokenSource(DataConfig(DataKind.BYTES, seed=1), vocab=256, length=64, global_batch=2)
    batch = source.global_batch_tokens(0)
    assert batch.shape == (2, 65) and int(batch.max()) < 256
    assert torch.equal(batch, TokenSource(DataConfig(DataKind.BYTES, seed=1), 256, 64, 2).global_batch_tokens(0))
    with pytest.raises(ValueError, match="vocabulary of at least 256"):
        TokenSource(DataConfig(DataKind.BYTES), vocab=64, length=64, global_batch=2)


def test_state_store_hands_each_entry_over_once():
    store = StateStore()
    store.put_forward_states(0, 1, [torch.ones(1)])
    assert store.take_forward_states(0, 1)[0].item() == 1
    assert store.is_empty()
    with pytest.raises(RuntimeError, match="microbatch 0, chunk 1 is not available"):
        store.take_forward_states(0, 1)
    store.put_state_gradients(2, 0, [torch.zeros(1)])
    assert "state gradients of 2.0" in store.describe_leftovers()


def test_receive_buffers_are_reused_by_shape():
    from schedlang.runtime.p2p import BufferPool

    pool = BufferPool()
    first = pool.get((2, 3), torch.float32, torch.device("cpu"))
    pool.give_back(first)
    assert pool.get((2, 3), torch.float32, torch.device("cpu")).data_ptr() == first.data_ptr()
    assert pool.get((2, 3), torch.float32, torch.device("cpu")).data_ptr() != first.data_ptr()
    assert pool.get((2, 4), torch.float32, torch.device("cpu")).shape == (2, 4)


def _hybrid_stage(dtype, layers=(LayerKind.GLA, LayerKind.ATTN, LayerKind.ATTN), device="cpu", **sizes):
    config = ModelConfig(**{"vocab": 64, "d_model": 32, "layers": layers, "heads": 2, "head_dim": 16, **sizes})
    return build_stage_model(config, tuple(range(len(layers))), True, True, 5, torch.device(device), dtype)


def _run_chunks_like_the_executor(model, tokens, bounds, saved_bytes=None):
    """Forward chunk by chunk with state hand-off and K/V buffers, then backward from the last chunk, as B does."""
    from schedlang.runtime.kv_buffers import ChunkPosition, SequenceKV

    kv = SequenceKV(tokens.shape[1])
    states, records = [None] * model.n_states, []

    def pack(tensor):
        if saved_bytes is not None:  # by storage: an alias of a K/V buffer is not a copy
            storage = tensor.untyped_storage()
            saved_bytes[storage.data_ptr()] = storage.nbytes()
        return tensor

    for start, end in bounds:
        leaves = [None if state is None else state.detach().requires_grad_(True) for state in states]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            hidden, finals = model(tokens[:, start:end], leaves, ChunkPosition(kv, 0, start, end))
        records.append((hidden, leaves, finals))
        states = [None if state is None else state.detach() for state in finals]
    outputs, state_grads = [], None
    upstream = torch.randn(
        tokens.shape[0], tokens.shape[1], model.config.d_model, dtype=hidden.dtype,
        generator=torch.Generator().manual_seed(9),
    ).to(hidden.device)
    for (start, end), (hidden, leaves, finals) in reversed(list(zip(bounds, records))):
        tensors, grads = [hidden], [upstream[:, start:end]]
        if state_grads is not None:
            pairs = [(final, grad) for final, grad in zip(finals, state_grads) if final is not None]
            tensors += [final for final, _ in pairs]
            grads += [grad for _, grad in pairs]
        torch.autograd.backward(tensors, grads)
        state_grads = [None if leaf is None else leaf.grad for leaf in leaves]
        outputs.insert(0, hidden.detach())
    return torch.cat(outputs, 1), upstream


def test_chunked_attention_over_sequence_buffers_equals_the_whole_sequence():
    """Hybrid stage (GLA + two attention layers) run in uneven chunks with the sequence-wide K/V buffers:
    outputs and every parameter gradient equal the whole sequence's in float64."""
    tokens = torch.randint(0, 64, (2, 90), generator=torch.Generator().manual_seed(1))
    whole_model, chunked_model = _hybrid_stage(torch.float64), _hybrid_stage(torch.float64)
    chunked, upstream = _run_chunks_like_the_executor(chunked_model, tokens, [(0, 17), (17, 64), (64, 90)])
    whole, _ = whole_model(tokens, [None] * 3)
    whole.backward(upstream)
    torch.testing.assert_close(chunked, whole.detach(), rtol=1e-10, atol=1e-10)
    for (name, parameter), reference in zip(chunked_model.named_parameters(), whole_model.parameters()):
        if reference.grad is not None:
            torch.testing.assert_close(parameter.grad, reference.grad, rtol=1e-10, atol=1e-10, msg=name)


def test_chunked_attention_saves_no_prefix_copies():
    """Saved tensors of all chunks of a sequence stay the same size whatever the chunk count: no chunk keeps
    a copy of the keys and values before it (those would grow with the square of the chunk count)."""
    tokens = torch.randint(0, 64, (1, 256), generator=torch.Generator().manual_seed(2))
    totals = {}
    for n_chunks in (1, 16):
        step = 256 // n_chunks
        saved = {}
        # attention-heavy: wide K/V, no MLP, so copied prefixes (8.5x the keys here) would dominate
        stage = _hybrid_stage(torch.float32, (LayerKind.ATTN,) * 2, d_model=16, heads=4, head_dim=32, mlp_ratio=0)
        _run_chunks_like_the_executor(stage, tokens, [(i * step, (i + 1) * step) for i in range(n_chunks)], saved)
        totals[n_chunks] = sum(saved.values())
    assert totals[16] < 1.3 * totals[1], totals


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_chunked_attention_over_sequence_buffers_on_the_gpu():
    """The same equality on CUDA in float32 (SDPA's lower-right causal bias, Triton GLA kernels)."""
    tokens = torch.randint(0, 64, (2, 320), generator=torch.Generator().manual_seed(1)).cuda()
    whole_model = _hybrid_stage(torch.float32, device="cuda")
    chunked_model = _hybrid_stage(torch.float32, device="cuda")
    chunked, upstream = _run_chunks_like_the_executor(chunked_model, tokens, [(0, 64), (64, 192), (192, 320)])
    whole, _ = whole_model(tokens, [None] * 3)
    whole.backward(upstream)
    assert float((chunked - whole.detach()).norm() / whole.norm()) < 1e-3
    for (name, parameter), reference in zip(chunked_model.named_parameters(), whole_model.parameters()):
        if reference.grad is not None:
            error = (parameter.grad - reference.grad).norm() / reference.grad.norm().clamp_min(1e-12)
            assert float(error) < 1e-3, name


def test_zero_gradients_zeroes_in_place_and_leaves_missing_gradients_alone():
    from schedlang.vocabulary import OptimizerConfig, TrainConfig
    from schedlang.runtime.trainer import build_optimizer, zero_gradients

    weights = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(2))]
    optimizer = build_optimizer(weights, TrainConfig(optimizer=OptimizerConfig(lr=1e-2)))
    weights[0].grad = torch.randn(3, 4)
    weights[1].grad = torch.randn(5)
    storages = [weights[0].grad.data_ptr(), weights[1].grad.data_ptr()]
    zero_gradients(optimizer)
    assert [weights[0].grad.data_ptr(), weights[1].grad.data_ptr()] == storages  # CUDA graphs keep these pointers
    assert not weights[0].grad.any() and not weights[1].grad.any()
    assert weights[2].grad is None
    assert not optimizer.defaults["fused"]  # torch's fused AdamW only where every parameter is on CUDA
