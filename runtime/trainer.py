"""The training loop a generated script runs on every rank.

One step: build the step's global batch (identical on every rank), run this
rank's action list, all-reduce gradients over the data-parallel group (the
loss is already normalised by the global token count, so a sum is exact),
sum the two copies' gradients of a tied embedding over the first and last
stage ([Note: tied embeddings across stages] in schedlang.runtime.model),
unscale them and agree on skipping the step with fp16's loss scale ([Note: loss
scaling] in schedlang.runtime.loss_scale), clip by the global norm over all
stages if asked (a tied embedding counted once), take the optimizer step
(with a 16-bit dtype, on the fp32 master weights: [Note: master weights] in
schedlang.runtime.master_weights), and report the loss summed over all ranks
(only last-stage ranks hold any), one step late, so that the stages never
wait for each other between steps ([Note: loss without a barrier] in
schedlang.runtime.step_loss).
"""

from __future__ import annotations

import resource
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from schedlang.runtime.config import PipelineConfig
from schedlang.runtime.cublas import use_workspace_free_gemms
from schedlang.runtime.data import DataFileError, TokenSource
from schedlang.runtime.executor import StageExecutor, StepShape
from schedlang.runtime.finite_guard import stop_unless_finite, stop_unless_finite_weights
from schedlang.runtime.graphs import GraphedChunks, GraphMaker, slots_needed
from schedlang.runtime.loss_scale import LossScaler
from schedlang.runtime.lr_schedule import build_scheduler, learning_rate_factor
from schedlang.runtime.master_weights import MasterWeights
from schedlang.runtime.step_graphs import StepGraphs
from schedlang.runtime.mesh import RuntimeMesh, init_mesh, tied_embedding_group
from schedlang.runtime.mixer_base import SequenceParallelContext
from schedlang.runtime.model import build_stage_model
from schedlang.runtime.offload import PinnedMemoryExhaustedError
from schedlang.runtime.p2p import StageMessenger
from schedlang.runtime.progress import StepMetrics, StepReporter
from schedlang.runtime.step_loss import PendingLoss, StepClock
from schedlang.vocabulary import (
    Action,
    CudaGraphs,
    DType,
    ModelConfig,
    OptimizerKind,
    TrainConfig,
    deferred_weight_units,
    recompute_on,
    require_supported,
    run_request,
)

DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16, DType.FP64: torch.float64}
TIED_EMBEDDING = "embedding.weight"
"""The parameter both ends of a pipeline hold with tied embeddings ([Note: tied embeddings across stages])."""


def build_optimizer(parameters, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD or AdamW as the schedule asks; on CUDA, AdamW is torch's fused implementation.

    The optimizer step sits on a pipeline's critical path at the step boundary: the first stage's next
    forward waits for it, and the later stages for that forward. The fused AdamW is one pass over the state,
    where torch's default (foreach) one launches many kernels (docs/benchmarks.md, "Measurements behind the
    runtime").
    """
    parameters = list(parameters)
    optimizer = config.optimizer
    groups = parameter_groups(parameters, config)
    if optimizer.kind is OptimizerKind.SGD:
        return torch.optim.SGD(
            groups, lr=optimizer.lr, momentum=optimizer.momentum, weight_decay=optimizer.weight_decay
        )
    on_cuda = bool(parameters) and all(parameter.is_cuda for parameter in parameters)
    return torch.optim.AdamW(
        groups, lr=optimizer.lr, betas=optimizer.betas, weight_decay=optimizer.weight_decay, fused=on_cuda or None
    )


def parameter_groups(parameters: list[torch.nn.Parameter], config: TrainConfig) -> list[dict]:
    """The optimizer's parameter groups: one, decayed by the optimizer's ``weight_decay``, unless
    ``train.decay_norms_and_biases = false``: then the parameters of fewer than two dimensions (norm weights,
    biases, Mamba gates' ``A_log`` and ``dt_bias``) form a second group without weight decay."""
    if config.decay_norms_and_biases or not config.optimizer.weight_decay:
        return [{"params": parameters}]
    decayed = [parameter for parameter in parameters if parameter.dim() >= 2]
    undecayed = [parameter for parameter in parameters if parameter.dim() < 2]
    return [group for group in ({"params": decayed}, {"params": undecayed, "weight_decay": 0.0}) if group["params"]]


def zero_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Zero every ``.grad`` in place (CUDA-graph stages and in-place weight gradients need the storage kept)
    with one multi-tensor kernel where ``zero_grad(set_to_none=False)`` launches one per parameter."""
    gradients = [
        parameter.grad for group in optimizer.param_groups for parameter in group["params"] if parameter.grad is not None
    ]
    if gradients:
        torch._foreach_zero_(gradients)


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_pinned_host_bytes(device: torch.device) -> int | None:
    """The most pinned host memory PyTorch's host allocator has held (its blocks as rounded up for CUDA, which
    can be more than the tensors in them: what offload's copies really pin), or None off CUDA or where this
    torch does not say."""
    if device.type != "cuda":
        return None
    peak = torch.cuda.host_memory_stats().get("allocated_bytes.peak")
    return None if peak is None else int(peak)


def allocator_retries(device: torch.device) -> int | None:
    """How often so far the CUDA caching allocator found no free block, released its cache and tried again (a
    device-wide synchronisation each time: what makes one step of a nearly full device slower than its
    neighbours), or None off CUDA."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


@dataclass
class Trainer:
    model_config: ModelConfig
    pipeline_config: PipelineConfig
    train_config: TrainConfig
    mesh: RuntimeMesh
    timeout_s: float = 300.0
    graph_maker: GraphMaker | None = None  # torch.cuda.make_graphed_callables unless a test passes a stand-in

    def __post_init__(self) -> None:
        """Refuses (``UnsupportedRunError``) what the capabilities list says the runtime cannot run."""
        require_supported(run_request(self.model_config, self.pipeline_config))
        pipeline, mesh = self.pipeline_config, self.mesh
        self.dtype = DTYPES[self.train_config.dtype]
        keeps_master_weights = self.train_config.keeps_master_weights
        self.model = build_stage_model(
            self.model_config,
            pipeline.stage_layers[mesh.stage],
            is_first=mesh.is_first_stage,
            is_last=mesh.is_last_stage,
            seed=self.train_config.seed,
            device=mesh.device,
            dtype=torch.float32 if keeps_master_weights else self.dtype,
            sequence_context=(
                SequenceParallelContext(
                    mesh.sequence_group, pipeline.sequence_method, pipeline.scan_blocks, pipeline.attention_exchange
                )
                if pipeline.sequence_parallel > 1
                else None
            ),
            recompute=recompute_on(pipeline.recompute, mesh.stage),
        )
        # [Note: master weights] in schedlang.runtime.master_weights
        self.master_weights = MasterWeights(self.model, self.dtype) if keeps_master_weights else None
        # the module whose parameters the optimizer updates and the checkpoints hold
        self.updated_module = self.model if self.master_weights is None else self.master_weights.module
        self.optimizer = build_optimizer(self.updated_module.parameters(), self.train_config)
        # [Note: tied embeddings across stages]; every rank builds every pair's group
        self.tied_group = tied_embedding_group(mesh) if self.model_config.options.tie_embeddings else None
        loss_scale = self.train_config.loss_scale
        self.loss_scaler = None if loss_scale is None else LossScaler(loss_scale, mesh.device)
        self.scheduler = self._scheduler(start_step=0)
        self.tokens = TokenSource(
            self.train_config.data, self.model_config.vocab, pipeline.sequence_length, pipeline.global_batch
        )
        world = list(range(mesh.world_size))
        messenger = StageMessenger(
            mesh.rank,
            mesh.device,
            self.timeout_s,
            activation_group=dist.new_group(world),
            gradient_group=dist.new_group(world),
        )
        actions = tuple(Action.parse(text) for text in pipeline.stage_actions[mesh.stage])
        global_tokens = pipeline.global_batch * pipeline.sequence_length
        self.executor = StageExecutor(
            self.model,
            StepShape(
                chunk_boundaries=pipeline.chunk_boundaries,
                local_chunk_bounds=tuple(
                    pipeline.local_bounds(chunk, mesh.sequence_index) for chunk in range(pipeline.n_chunks)
                ),
                microbatch_size=pipeline.microbatch_size,
                d_model=self.model_config.d_model,
                global_tokens=global_tokens,
                recompute=recompute_on(pipeline.recompute, mesh.stage),
                sequence_slices=(
                    tuple(
                        tuple(pipeline.local_bounds(chunk, index) for index in range(pipeline.sequence_parallel))
                        for chunk in range(pipeline.n_chunks)
                    )
                    if pipeline.sequence_parallel > 1
                    else ()
                ),
                offload=pipeline.offload,
                document_end=self.tokens.document_end,
            ),
            actions,
            messenger,
            mesh.stage,
            mesh.previous_stage_rank,
            mesh.next_stage_rank,
            self.dtype,
            graphs=self._chunk_graphs(actions, global_tokens),
            step_graphs=StepGraphs(self.model, mesh.device) if pipeline.cuda_graphs is CudaGraphs.STEP else None,
            gradients_formed=None if self.master_weights is None else self.master_weights.accumulate_gradients,
        )
        if self.loss_scaler is not None:  # [Note: loss scaling]
            self.executor.loss_gradient = self.loss_scaler.scale
        self.start_step = 0

    def _chunk_graphs(self, actions: tuple[Action, ...], global_tokens: int) -> GraphedChunks | None:
        if self.pipeline_config.cuda_graphs is not CudaGraphs.CHUNK_SLOTS:
            return None
        maker = self.graph_maker
        if maker is None:
            if self.mesh.device.type != "cuda":
                raise ValueError("pipeline { cuda_graphs = true } replays CUDA graphs: run it with --device cuda")
            maker = torch.cuda.make_graphed_callables
        splitting = bool(deferred_weight_units(actions))  # [Note: splitting slots]
        return GraphedChunks(self.model, slots_needed(actions), global_tokens, maker, splitting)

    def forward_backward(self, step: int) -> float:
        """Run one step's tasks and reduce gradients; the optimizer step is separate so tests can read gradients."""
        return self.queue_step(step).value()

    def queue_step(self, step: int) -> PendingLoss:
        """``forward_backward`` whose loss is summed over the ranks in the background: read it with ``value()``
        after queueing more work ([Note: loss without a barrier])."""
        zero_gradients(self.optimizer)
        tokens = self.tokens.replica_tokens(step, self.mesh.data_index, self.pipeline_config.sequences_per_replica)
        loss = self.executor.run_step(tokens, self.tokens.loss_tokens(step))
        self.reduce_gradients()
        return PendingLoss(loss)

    def evaluate(self) -> float:
        """The mean loss over ``eval_batches`` validation batches, summed over the ranks like a step's
        ([Note: forward-only evaluation] in schedlang.runtime.executor); the same on every rank."""
        pipeline, batches = self.pipeline_config, self.train_config.eval_batches
        total = 0.0
        for index in range(batches):
            tokens = self.tokens.validation_replica_tokens(index, self.mesh.data_index, pipeline.sequences_per_replica)
            loss = self.executor.run_evaluation_step(tokens, self.tokens.validation_loss_tokens(index))
            total += PendingLoss(loss).value()
        return total / batches

    def reduce_gradients(self) -> None:
        """All-reduce over the sequence and data groups, sum a tied embedding's two copies, unscale (fp16's loss
        scale: ``loss_scaler.skipped`` then says the step is skipped everywhere), clip."""
        gradients = [parameter.grad for parameter in self.updated_module.parameters()]
        # Every sequence-parallel rank and data replica saw different tokens of the global batch.
        groups = [
            group
            for group, size in (
                (self.mesh.sequence_group, self.pipeline_config.sequence_parallel),
                (self.mesh.data_group, self.pipeline_config.data_parallel),
            )
            if size > 1
        ]
        if groups:
            flat = torch._utils._flatten_dense_tensors(gradients)
            for group in groups:
                dist.all_reduce(flat, group=group)
            for gradient, reduced in zip(gradients, torch._utils._unflatten_dense_tensors(flat, gradients)):
                gradient.copy_(reduced)
        if self.tied_group is not None:  # both copies get the sum, bit for bit
            dist.all_reduce(self.updated_module.get_parameter(TIED_EMBEDDING).grad, group=self.tied_group)
        if self.loss_scaler is not None and self.loss_scaler.unscale(gradients):
            return
        if self.train_config.grad_clip is not None:
            counted = [
                parameter.grad
                for name, parameter in self.updated_module.named_parameters()
                if not (name == TIED_EMBEDDING and self.model.holds_embedding_copy)  # the first stage counts it
            ]
            squared = torch.stack([gradient.double().pow(2).sum() for gradient in counted]).sum()
            dist.all_reduce(squared, group=self.mesh.pipeline_group)
            scale = min(1.0, self.train_config.grad_clip / (float(squared.sqrt()) + 1e-6))
            for gradient in gradients:
                gradient.mul_(scale)

    def named_gradients(self) -> dict[str, torch.Tensor]:
        """The step's gradient of every parameter by name (fp32 with master weights)."""
        return {name: parameter.grad.detach().clone() for name, parameter in self.updated_module.named_parameters()}

    def optimizer_step(self) -> None:
        """The optimizer step (skipped on every rank when the loss scale found inf or nan), the loss scale's
        update and the learning-rate schedule's advance, which a skipped step takes too ([Note: loss scaling])."""
        skipped = self.loss_scaler is not None and self.loss_scaler.skipped
        if not skipped:
            self.optimizer.step()
            if self.master_weights is not None:
                self.master_weights.copy_to_model()
        if self.loss_scaler is not None:
            self.loss_scaler.update()
        with warnings.catch_warnings():
            # torch warns when a schedule advances before any optimizer step, as after a skipped first step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()

    def _scheduler(self, start_step: int):
        config = self.train_config
        return build_scheduler(self.optimizer, config.lr_schedule, config.steps, config.optimizer.lr, start_step)

    def close(self) -> None:
        """Leave the job cleanly so torchrun sees every rank finish."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def run_record(self) -> dict[str, str]:
        """What each checkpoint records and a resume compares (schedlang.runtime.checkpoint_manifest)."""
        from schedlang.runtime.checkpoint_manifest import run_record

        mesh_shape = (self.mesh.n_stages, self.pipeline_config.sequence_parallel, self.pipeline_config.data_parallel)
        return run_record(self.model_config, self.pipeline_config, self.train_config, mesh_shape)

    def resume(self, steps: int | None = None) -> int:
        """Load the newest checkpoint; exits (one line) when it is refused or has reached ``steps`` already."""
        if self.train_config.checkpoint_directory:
            from schedlang.runtime.checkpoint import resume_or_exit

            self.start_step = resume_or_exit(
                self.train_config.checkpoint_directory,
                self.updated_module,
                self.optimizer,
                self.run_record(),
                steps,
                loss_scale=None if self.loss_scaler is None else self.loss_scaler.state_dict(),
            )
            if self.master_weights is not None:
                self.master_weights.copy_to_model()
            self.scheduler = self._scheduler(self.start_step)
        return self.start_step

    def train(self, steps: int, metrics_path: str | None = None, stop_after: int | None = None) -> list[float]:
        """Train up to step ``steps`` (counting from 0), resuming from a checkpoint if there is one.

        ``stop_after`` ends the run early after that many steps of this
        invocation, as a kill would; the tests use it to check resumption.
        """
        config = self.train_config
        reporter = None
        if self.mesh.rank == 0:
            reporter = StepReporter(steps, metrics_path, tensorboard_directory=config.tensorboard_directory)
        tokens_per_step = self.pipeline_config.global_batch * self.pipeline_config.sequence_length
        losses: list[float] = []
        validation_losses: dict[int, float] = {}  # step done -> the validation loss after it
        # (step number done, its loss, its clock token, its loss scale and whether it was skipped): read after the
        # next step is queued
        pending = None

        last_saved = None  # the step of this run's newest checkpoint ([Note: non-finite loss])

        def report(done: int, loss: PendingLoss, clock_token, scaling: tuple[float, bool] | None) -> None:
            losses.append(loss.value())  # returns once that step has finished on every rank
            elapsed = clock.seconds(clock_token)
            if reporter is not None:  # every step goes to --metrics; log_every thins the printed lines only
                peak = peak_memory_bytes(self.mesh.device)
                validation = validation_losses.get(done)
                scale, skipped = (None, None) if scaling is None else scaling
                rate = config.optimizer.lr * learning_rate_factor(
                    config.lr_schedule, done - 1, config.steps, config.optimizer.lr
                )
                pinned = peak_pinned_host_bytes(self.mesh.device) if self.executor.offload is not None else None
                metrics = StepMetrics(
                    done, losses[-1], tokens_per_step / elapsed, elapsed, peak, validation, scale, skipped, rate, pinned,
                    allocator_retries(self.mesh.device),
                )
                show = done % config.log_every == 0 or done == steps or validation is not None
                reporter.report(metrics, show=show)
            skipped = scaling is not None and bool(scaling[1])
            stop_unless_finite(done, losses[-1], skipped, self.mesh.rank == 0, last_saved)

        try:
            first = self.resume(steps)
            last_saved = first or None
            clock = StepClock(self.mesh.device)
            for step in range(first, steps):
                loss = self.queue_step(step)
                self.optimizer_step()
                token = clock.step_ended()
                done = step + 1
                if config.checkpoint_directory and config.checkpoint_every and done % config.checkpoint_every == 0:
                    from schedlang.runtime.checkpoint import save_checkpoint

                    skipped = self.loss_scaler is not None and self.loss_scaler.skipped
                    stop_unless_finite(done, loss.value(), skipped, self.mesh.rank == 0, last_saved)
                    stop_unless_finite_weights(
                        done, self.updated_module.parameters(), self.mesh.device, self.mesh.rank == 0, last_saved
                    )
                    save_checkpoint(
                        config.checkpoint_directory,
                        done,
                        self.updated_module,
                        self.optimizer,
                        self.run_record(),
                        loss_scale=None if self.loss_scaler is None else self.loss_scaler.state_dict(),
                    )
                    last_saved = done
                if config.eval_every and done % config.eval_every == 0:
                    validation_losses[done] = self.evaluate()
                    clock.step_ended()  # the next step's time starts after the evaluation
                if pending is not None:
                    report(*pending)
                scaler = self.loss_scaler
                pending = (done, loss, token, None if scaler is None else (scaler.scale_used, scaler.skipped))
                if stop_after is not None and step - first + 1 >= stop_after:
                    break
            if pending is not None:
                report(*pending)
        except DataFileError as error:  # a data file that changed under the run ([Note: truncated tokens])
            raise SystemExit(f"schedlang: error: {error}") from None
        except PinnedMemoryExhaustedError as error:  # offload past the host's memory ([Note: activation offload])
            raise SystemExit(f"schedlang: error: {error}") from None
        finally:
            if reporter is not None:
                reporter.close()
        return losses


def launch(
    model_config: ModelConfig,
    pipeline_config: PipelineConfig,
    train_config: TrainConfig,
    mesh_shape: tuple[int, int, int],
    device_type: str,
    timeout_s: float = 300.0,
    graph_maker: GraphMaker | None = None,
) -> Trainer:
    """Join the torchrun job and build this rank's trainer.

    On CUDA with ``cuda_graphs``, first gives cuBLAS no workspace (unless the user chose one): [Note: GEMMs
    without a workspace in CUDA graphs] in schedlang.runtime.cublas.
    """
    if device_type == "cuda" and pipeline_config.cuda_graphs:
        use_workspace_free_gemms()
    mesh = init_mesh(*mesh_shape, device_type=device_type, timeout_s=timeout_s)
    return Trainer(model_config, pipeline_config, train_config, mesh, timeout_s=timeout_s, graph_maker=graph_maker)


__all__ = ["Trainer", "launch", "record"]
