"""Acceptance (issue 18): recompute = mlp | mixer | full and offload = true change memory, never results.

Exactness: generated scripts run on one process and on a pipeline of 2 stages (gloo) with several chunks, with
gla layers and with a hybrid stack holding attn and gdn layers, deferred weight gradients, MLPs as layers of
their own and a sequence-parallel group; each run's losses and every parameter gradient equal those of the
same schedule with ``recompute = none`` within 1e-5. In one process (a 1-rank gloo group, through the
generated script's records and ``launch``): the offload hooks run and change nothing, the K/V buffers of attn
layers are rewritten with the values they hold, and the bytes autograd keeps for a chunk fall in the order
full < mlp, mixer < none. On a GPU (a stage model, no process group): offload moves the saved bytes off the
device, and the recomputed parts' gradients equal the kept ones.
"""

from __future__ import annotations

import gc
import importlib.util
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from runtime_harness import compile_schedule, free_port, relative_error, run_jobs
from schedlang.runtime.kv_buffers import BufferedChunkAttention
from schedlang.runtime.model import build_stage_model
from schedlang.compiler import Pass, ScheduleText
from schedlang.compiler import compile_schedule as schedlang_compile
from schedlang.lowering.memory_peak import predict_memory
from schedlang.lowering.memory_terms import Device
from schedlang.runtime.offload import ActivationOffload, PinnedBudget, PinnedSlabs, storage_key
from schedlang.runtime.trainer import launch
from schedlang.vocabulary import ActionKind, LayerKind, ModelConfig, OffloadCopy, Recompute, offload_copies

STEPS = 2
TOLERANCE = 1e-5
GPU_ATTENTION_TOLERANCE = 5e-5
"""Two float32 backwards of the same attention on CUDA may sum dQ/dK/dV in different orders (the fused
kernels accumulate with atomics): an H200 gave 1.1e-5 relative on the embedding's gradient between two runs."""

GLA_LAYERS = "[gla, simple_gla] * 2"
HYBRID_LAYERS = "[gla, attn, gdn, simple_gla]"
SPLIT_MLP_LAYERS = "[gla, mlp, attn, mlp]"  # [Note: separate MLP layers]


def schedule_text(
    name: str,
    layers: str,
    pipeline: int = 2,
    recompute: str = "none",
    offload: bool = False,
    order: str = "1f1b",
    sequence: int = 1,
    split_backward: bool = False,
    chunks: str = "3",
) -> str:
    return f"""schedule {name}
model {{ vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = {layers}  mlp = swiglu(ratio = 2) }}
mesh {{ pipeline = {pipeline}  sequence = {sequence} }}
sequence {{ length = 96  chunks = {chunks}  kernel_chunk = 16  parallel = ring }}
pipeline {{
  microbatches = 2  microbatch_size = 2  order = {order}  recompute = {recompute}  offload = {str(offload).lower()}
  split_backward = {str(split_backward).lower()}
}}
train {{ steps = {STEPS}  seed = 3  optimizer = adamw(lr = 1e-2)  data = synthetic(seed = 4) }}
"""


# The variants of each base schedule: (name suffix, recompute, offload)
MODES = (
    ("mlp", "mlp", False),
    ("mixer", "mixer", False),
    ("full", "full", False),
    ("offload", "none", True),
    ("mixer_offload", "mixer", True),
    ("mlp_offload", "mlp", True),
)


REFERENCE_OF: dict[str, str] = {}  # each compared run -> the recompute = none run of the same schedule


def variants(base: str, **settings) -> dict[str, str]:
    """The base schedule with recompute = none, then each mode of MODES (names ``<base>_<suffix>``)."""
    reference = f"{base}_none"
    runs = {reference: schedule_text(reference, **settings)}
    for suffix, recompute, offload in MODES:
        name = f"{base}_{suffix}"
        runs[name] = schedule_text(name, recompute=recompute, offload=offload, **settings)
        REFERENCE_OF[name] = reference
    return runs


def ring_variants() -> dict[str, str]:
    """A sequence-parallel group: the rerun mixer runs the ring's collectives again, on both ranks alike."""
    settings = dict(layers=GLA_LAYERS, pipeline=1, sequence=2)
    runs = {"p1_s2_n3_ring_none": schedule_text("p1_s2_n3_ring_none", **settings)}
    for name, recompute, offload in (("p1_s2_n3_ring_mixer", "mixer", False), ("p1_s2_n3_ring_mlp_offload", "mlp", True)):
        runs[name] = schedule_text(name, recompute=recompute, offload=offload, **settings)
        REFERENCE_OF[name] = "p1_s2_n3_ring_none"
    return runs


def per_stage_variants() -> dict[str, str]:
    """A mode per stage (``recompute = [full, mixer]``): each stage's blocks and executor take their own."""
    settings = dict(layers=HYBRID_LAYERS, chunks="[0, 16, 64, 96]")
    name = "p2_n3_hybrid_full_then_mixer"
    REFERENCE_OF[name] = "p2_n3_hybrid_none"
    return {name: schedule_text(name, recompute="[full, mixer]", **settings)}


JOBS = {
    1: {
        **variants("p1_n3_gla", layers=GLA_LAYERS, pipeline=1),
        **variants("p1_n3_hybrid", layers=HYBRID_LAYERS, pipeline=1),
    },
    2: {
        **variants("p2_n3_gla", layers=GLA_LAYERS),
        **variants("p2_n3_hybrid", layers=HYBRID_LAYERS, chunks="[0, 16, 64, 96]"),
        # deferred W tasks ([Note: deferred weight gradients]): a rerun part records its weight gradients too
        **variants("p2_n3_split_backward_gpipe", layers=HYBRID_LAYERS, order="gpipe", split_backward=True),
        **variants("p2_n2_split_mlp", layers=SPLIT_MLP_LAYERS, chunks="2"),
        **ring_variants(),
        **per_stage_variants(),
    },
}
COMPARED = list(REFERENCE_OF)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Run every schedule; returns name -> (losses, gradients after the first step)."""
    directory = tmp_path_factory.mktemp("recompute")
    return run_jobs(JOBS, directory, STEPS, wall_timeout_s=900.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPARED)
def test_losses_and_gradients_equal_those_without_recompute(matrix, name):
    reference_losses, reference_gradients = matrix[REFERENCE_OF[name]]
    losses, gradients = matrix[name]
    assert len(losses) == STEPS
    for step, (loss, reference) in enumerate(zip(losses, reference_losses)):
        assert abs(loss - reference) <= TOLERANCE * abs(reference), f"step {step}: {loss} vs {reference}"
    assert sorted(gradients) == sorted(reference_gradients)
    errors = {key: relative_error(gradients[key], reference_gradients[key]) for key in reference_gradients}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{worst}: relative error {errors[worst]:.2e}"


@pytest.fixture(scope="module")
def one_rank_group():
    """A 1-rank gloo group, so ``launch`` builds trainers in this process (init_mesh finds it initialised)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"generated_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_rank_trainer(tmp_path: Path, name: str, device: str = "cpu", **settings):
    script = load_script(compile_schedule(schedule_text(name, pipeline=1, **settings), tmp_path, name))
    return launch(script.MODEL, script.PIPELINE, script.TRAIN, script.MESH_SHAPE, device)


def first_step(trainer) -> tuple[float, dict[str, torch.Tensor]]:
    loss = trainer.forward_backward(0)
    return loss, trainer.named_gradients()


@pytest.mark.parametrize("layers", [GLA_LAYERS, HYBRID_LAYERS], ids=["gla", "hybrid"])
def test_offload_hooks_pack_and_unpack_and_change_nothing(one_rank_group, tmp_path, layers):
    plain = one_rank_trainer(tmp_path, "plain", layers=layers)
    offloaded = one_rank_trainer(tmp_path, "offloaded", layers=layers, offload=True)
    assert plain.executor.offload is None
    offload = offloaded.executor.offload
    saved_units = []
    saving = offload.saving
    offload.saving = lambda key: saved_units.append(key) or saving(key)
    reference_loss, reference_gradients = first_step(plain)
    loss, gradients = first_step(offloaded)
    counts = offload.counts
    actions = offloaded.executor.actions
    backwards = [(action.microbatch, action.chunk) for action in actions if action.kind is ActionKind.BACKWARD]
    # one stage, 1f1b: each microbatch's last chunk runs its backward right after its forward and keeps what it
    # saves on the device; every other chunk goes to the host and is prefetched back
    last_chunks = {(microbatch, max(chunk for _, chunk in backwards)) for microbatch, _ in backwards}
    kept = {unit for unit, copy in offload_copies(actions).items() if copy is OffloadCopy.KEPT}
    assert kept == last_chunks and len(kept) == 2
    assert sorted(saved_units) == sorted(set(backwards) - kept)
    assert counts.packed > counts.copied > 0  # parameters, K/V buffers and repeats are not copied
    assert counts.unpacked >= counts.copied
    assert counts.prefetched_chunks == len(backwards) - len(kept)
    assert offloaded.executor.offload.chunks == {}  # every chunk released by its backward
    assert loss == reference_loss
    assert all(torch.equal(gradients[key], reference_gradients[key]) for key in reference_gradients)


def test_offload_pins_what_the_memory_model_predicts_and_gives_it_back(one_rank_group, tmp_path):
    """On the CPU nothing is pinned and no budget is read; given one, the offload counts its copies: at most what
    the memory model's ``pinned_host`` says (gla: within 5%), and nothing once every chunk's backward ran."""
    trainer = one_rank_trainer(tmp_path, "pinned", layers=GLA_LAYERS, offload=True, recompute="mlp")
    assert trainer.executor.offload.budget is None  # the CPU: nothing changes
    budget = PinnedBudget(available=10**15)
    trainer.executor.offload = ActivationOffload(torch.device("cpu"), trainer.executor._stays_resident, budget)
    first_step(trainer)
    assert budget.pinned == 0 and budget.most > 0
    text = schedule_text("pinned", layers=GLA_LAYERS, pipeline=1, offload=True, recompute="mlp")
    program = schedlang_compile(ScheduleText(text), through=Pass.ORDER).program
    (predicted,) = predict_memory(program, device=Device.CPU)
    assert budget.most == pytest.approx(predicted.pinned_host, rel=0.05)


def test_offload_past_the_hosts_memory_stops_the_run_with_one_line(one_rank_group, tmp_path):
    trainer = one_rank_trainer(tmp_path, "too_much", layers=GLA_LAYERS, offload=True)
    budget = PinnedBudget(available=64 * 1024)
    trainer.executor.offload = ActivationOffload(torch.device("cpu"), trainer.executor._stays_resident, budget)
    with pytest.raises(SystemExit) as stopped:
        trainer.train(1)
    message = str(stopped.value.code)
    assert message.startswith("schedlang: error: pipeline.offload needs ") and "\n" not in message
    assert "GiB of pinned host memory for this rank's saved activations so far (at microbatch and chunk (0, " in message
    assert "recompute = full" in message and "schedlang simulate FILE" in message
    assert budget.pinned <= budget.available


class CopyingOffload(ActivationOffload):
    """CPU stand-in for the copies CUDA makes: each saved tensor's "host copy" is a clone, so a result that
    read the original instead of its copy, or the wrong copy, would show."""

    def _copy_to_host(self, tensor: torch.Tensor, key) -> torch.Tensor:
        return tensor.detach().clone()


class SlabCopyingOffload(ActivationOffload):
    """CPU stand-in whose copies are views into :class:`PinnedSlabs` (pageable), as on CUDA: slabs from 4 KiB to
    64 KiB, so a chunk's copies fill several, some copies take larger slabs of their own, and a later step reuses
    the slabs."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.slabs = PinnedSlabs(first=4096, largest=64 * 1024, pin=False)

    def _copy_to_host(self, tensor: torch.Tensor, key) -> torch.Tensor:
        host = self.slabs.tensor(key, tensor.shape, tensor.dtype)
        return host.copy_(tensor)


@pytest.mark.parametrize("copies", [CopyingOffload, SlabCopyingOffload], ids=["clones", "slabs"])
@pytest.mark.parametrize("recompute", ["none", "mlp", "mixer"])
def test_offload_through_real_copies_changes_nothing(one_rank_group, tmp_path, recompute, copies):
    plain = one_rank_trainer(tmp_path, "plain", layers=HYBRID_LAYERS, recompute=recompute)
    copying = one_rank_trainer(tmp_path, "copying", layers=HYBRID_LAYERS, recompute=recompute, offload=True)
    copying.executor.offload = copies(torch.device("cpu"), copying.executor._stays_resident)
    for _ in range(2):  # the second step's copies land in the slabs the first step's chunks gave back
        reference_loss, reference_gradients = first_step(plain)
        loss, gradients = first_step(copying)
        assert copying.executor.offload.counts.copied > 0
        assert loss == reference_loss
        assert all(torch.equal(gradients[key], reference_gradients[key]) for key in reference_gradients)


def test_pinned_slabs_grow_place_copies_apart_and_reuse_a_released_chunks_slabs():
    slabs = PinnedSlabs(first=2048, largest=8192, pin=False)
    first = slabs.tensor("a", torch.Size([300]), torch.float32)  # 1,200 bytes, 1,536 with the alignment
    second = slabs.tensor("a", torch.Size([10, 10]), torch.bfloat16)  # 200 bytes: still in the first slab
    third = slabs.tensor("a", torch.Size([700]), torch.float32)  # 2,800 bytes: a second slab, twice the first
    fourth = slabs.tensor("a", torch.Size([100]), torch.float32)  # 400 bytes: the first slab is full, the second's room
    other = slabs.tensor("b", torch.Size([8]), torch.float64)  # another chunk: a first slab of its own
    big = slabs.tensor("a", torch.Size([5000]), torch.float32)  # 20,000 bytes: a slab of 32 KiB, past the largest
    tensors = (first, second, third, fourth, other, big)
    for index, tensor in enumerate(tensors):
        tensor.fill_(index)
    for index, tensor in enumerate(tensors):
        assert torch.all(tensor == index) and tensor.is_contiguous()
    assert second.dtype == torch.bfloat16 and second.shape == (10, 10)
    assert second.data_ptr() - first.data_ptr() == 1536 and fourth.data_ptr() - third.data_ptr() == 3072
    assert slabs.pinned_bytes == 2048 + 4096 + 2048 + 32768
    starts = {first.data_ptr(), third.data_ptr(), big.data_ptr()}
    slabs.give_back("a")
    assert slabs.pinned_bytes == 2048 + 4096 + 2048 + 32768  # kept for the next chunks
    again = [slabs.tensor("c", torch.Size([size]), torch.float32) for size in (500, 1000, 5000)]
    assert {tensor.data_ptr() for tensor in again} == starts  # the same slabs, nothing new pinned
    assert slabs.pinned_bytes == 2048 + 4096 + 2048 + 32768



def saved_bytes_of_one_chunk(trainer) -> int:
    """Bytes of the distinct storages (parameters aside) that autograd still holds after one chunk's forward."""
    executor = trainer.executor
    executor.tokens = trainer.tokens.replica_tokens(0, 0, trainer.pipeline_config.sequences_per_replica)
    parameters = {storage_key(parameter) for parameter in trainer.model.parameters()}
    packed = []

    class Saved:
        def __init__(self, tensor):
            self.tensor = tensor

    def pack(tensor):
        saved = Saved(tensor)
        packed.append(weakref.ref(saved))
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved.tensor):
        executor.forward(0, 1)  # a middle chunk: it has initial states, and attn reads a prefix
    gc.collect()
    storages = {}
    for reference in packed:
        saved = reference()
        if saved is not None and storage_key(saved.tensor) not in parameters:
            storages[storage_key(saved.tensor)] = saved.tensor.untyped_storage().nbytes()
    return sum(storages.values())


def test_each_recompute_mode_keeps_fewer_bytes(one_rank_group, tmp_path):
    """A chunk's forward runs after chunk 0's (its states and K/V prefix exist) under each mode."""
    saved = {}
    # each mode as one value, and as a per-stage list of the one stage (the generated script's tuple)
    for written in [mode.value for mode in Recompute] + [f"[{mode.value}]" for mode in Recompute]:
        name = f"saved_{written.strip('[]')}" + ("_listed" if written.startswith("[") else "")
        trainer = one_rank_trainer(tmp_path, name, layers=HYBRID_LAYERS, recompute=written)
        executor = trainer.executor
        executor.tokens = trainer.tokens.replica_tokens(0, 0, trainer.pipeline_config.sequences_per_replica)
        executor.forward(0, 0)
        saved[written] = saved_bytes_of_one_chunk(trainer)
    assert saved["full"] < min(saved["mlp"], saved["mixer"]), saved
    assert max(saved["mlp"], saved["mixer"]) < saved["none"], saved
    assert all(saved[f"[{mode.value}]"] == saved[mode.value] for mode in Recompute), saved


def test_mixer_recompute_rewrites_the_kv_buffers_with_their_values(one_rank_group, tmp_path, monkeypatch):
    """Every rerun of an attention layer writes into the sequence-wide buffers exactly what they hold."""
    trainer = one_rank_trainer(tmp_path, "kv", layers=HYBRID_LAYERS, recompute="mixer", order="gpipe")
    executor = trainer.executor
    executor.tokens = trainer.tokens.replica_tokens(0, 0, trainer.pipeline_config.sequences_per_replica)
    forwards = [action for action in executor.actions if action.kind is ActionKind.FORWARD]
    backwards = [action for action in executor.actions if action.kind is ActionKind.BACKWARD]
    assert executor.actions == tuple(forwards + backwards)  # gpipe on one stage: every F, then every B
    for action in forwards:
        executor.run_action(action)
    held = {key: (buffers.keys.clone(), buffers.values.clone()) for key, buffers in executor.kv.open.items()}
    assert held  # one attn layer, two microbatches
    rewrites = []
    original = BufferedChunkAttention.forward

    def recording_forward(ctx, q, k, v, chunk, *group_documents_exchange):
        position = chunk.position
        rewrites.append((position.microbatch, chunk.layer, position.start, k.detach().clone(), v.detach().clone()))
        return original(ctx, q, k, v, chunk, *group_documents_exchange)

    monkeypatch.setattr(BufferedChunkAttention, "forward", staticmethod(recording_forward))
    for action in backwards:
        executor.run_action(action)
    # each chunk's attention reruns once (its backward is a function of saved tensors, no nested autograd.grad:
    # [Note: attention in parts])
    assert len(rewrites) == len(forwards)
    for microbatch, layer, start, keys, values in rewrites:
        held_keys, held_values = held[(microbatch, layer)]
        end = start + keys.shape[2]
        assert torch.equal(keys, held_keys[:, :, start:end]) and torch.equal(values, held_values[:, :, start:end])


def gpu_stage(layers: tuple[LayerKind, ...], recompute: Recompute = Recompute.NONE):
    config = ModelConfig(vocab=256, d_model=256, layers=layers, heads=4, head_dim=64, mlp_ratio=4.0)
    indices = tuple(range(len(layers)))
    return build_stage_model(config, indices, True, True, 5, torch.device("cuda"), torch.float32, recompute=recompute)


GPU_STACKS = {
    "gla": (LayerKind.GLA, LayerKind.SIMPLE_GLA) * 2,
    "hybrid": (LayerKind.GLA, LayerKind.ATTN, LayerKind.GDN, LayerKind.SIMPLE_GLA),
}


def gpu_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    hidden, _ = model(tokens[:, :-1], [None] * model.n_states)
    return model.loss(hidden, tokens[:, 1:]) / tokens[:, 1:].numel()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("stack", list(GPU_STACKS))
def test_offload_moves_the_saved_bytes_off_the_gpu(stack):
    """After a forward, the device holds less by the bytes of every storage the saved tensors keep alive;
    the gradients are unchanged."""
    model = gpu_stage(GPU_STACKS[stack])
    tokens = torch.randint(0, 256, (4, 1025), generator=torch.Generator().manual_seed(0)).cuda()
    kept = {storage_key(parameter) for parameter in model.parameters()} | {storage_key(tokens)}
    saved_storages: dict[int, int] = {}

    def measure(tensor):
        if storage_key(tensor) not in kept:
            saved_storages[storage_key(tensor)] = tensor.untyped_storage().nbytes()
        return tensor

    gpu_loss(model, tokens).backward()  # one-time allocations (cuBLAS workspaces, kernel caches) before measuring
    held, gradients = {}, {}
    for offload in (False, True):
        model.zero_grad(set_to_none=True)
        activations = ActivationOffload(torch.device("cuda"), lambda tensor: storage_key(tensor) in kept)
        if offload:
            hooks = activations.saving("chunk")
        else:
            hooks = torch.autograd.graph.saved_tensors_hooks(measure, lambda tensor: tensor)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with hooks as chunk:
            loss = gpu_loss(model, tokens)
        torch.cuda.synchronize()
        # blocks freed after record_stream on the copy stream return to the allocator at its next allocation
        torch.empty(1, device="cuda")
        held[offload] = torch.cuda.memory_allocated() - before
        activations.prefetch("chunk")
        loss.backward()
        gradients[offload] = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
        if offload:
            assert chunk.host_bytes > 0 and all(tensor.is_pinned() for tensor in chunk.host)
            assert activations.counts.unpacked >= activations.counts.copied > 0
    dropped = held[False] - held[True]
    saved_bytes = sum(saved_storages.values())
    # the caching allocator rounds every block up to a multiple of 512 bytes
    assert abs(dropped - saved_bytes) <= 512 * len(saved_storages), (dropped, saved_bytes)
    for name, reference in gradients[False].items():
        assert relative_error(gradients[True][name], reference) <= GPU_ATTENTION_TOLERANCE, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("mode", [Recompute.MLP, Recompute.MIXER])
def test_recompute_on_the_gpu_equals_keeping_everything(mode):
    """The Triton kernels' autograd functions rerun under torch.utils.checkpoint, on CUDA."""
    tokens = torch.randint(0, 256, (2, 513), generator=torch.Generator().manual_seed(1)).cuda()
    gradients = {}
    for recompute in (Recompute.NONE, mode):
        model = gpu_stage(GPU_STACKS["hybrid"], recompute)
        gpu_loss(model, tokens).backward()
        gradients[recompute] = {name: parameter.grad for name, parameter in model.named_parameters()}
    for name, reference in gradients[Recompute.NONE].items():
        assert relative_error(gradients[mode][name], reference) <= TOLERANCE, name


def test_offload_never_takes_a_new_tensor_at_a_freed_address_for_the_old_one():
    """On CUDA a saved tensor's memory is freed once its copy is queued, and the allocator may give it to a
    new tensor of the same shape; that one must get a copy of its own. Emulated on the CPU: the copying
    stand-in, and two tensors laid on the same memory with version counters of their own."""

    memory = torch.zeros(8).untyped_storage()

    def tensor_at_that_address(value: float) -> torch.Tensor:
        tensor = torch.empty(0).set_(memory, 0, (8,), (1,))
        with torch.no_grad():
            tensor.fill_(value)
        return torch.empty(0).set_(memory, 0, (8,), (1,))  # version 0, as a freshly allocated tensor

    offload = CopyingOffload(torch.device("cpu"), lambda tensor: False)
    with offload.saving("chunk"):
        first = offload._pack(offload.chunks["chunk"], tensor_at_that_address(1.0))
        second = offload._pack(offload.chunks["chunk"], tensor_at_that_address(2.0))
    offload.prefetch("chunk")
    assert offload.counts.copied == 2
    assert torch.equal(offload._unpack(first), torch.full((8,), 1.0))
    assert torch.equal(offload._unpack(second), torch.full((8,), 2.0))
