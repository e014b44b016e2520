"""The hybrid schedules of the mesh matrix: [gla, gla, gla, attn] * 4 and [gdn, gdn, gdn, attn] * 4 on every
mesh of 2-4 ranks, and the one-process schedule each must equal.

Every schedule trains the same model on the same global batch of 12 sequences of 96 tokens (12 divides
over every data-parallel width), so the one-process reference of a model serves every mesh.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlang.runtime.config import PipelineConfig
from schedlang.vocabulary import ModelConfig, refusals, run_request

STEPS = 2
SEQUENCE_LENGTH = 96
GLOBAL_BATCH = 12
REPEATS = 4
MODELS = {"gla": ("gla", "gla", "gla", "attn"), "gdn": ("gdn", "gdn", "gdn", "attn")}  # repeated REPEATS times


@dataclass(frozen=True)
class Mesh:
    pipeline: int = 1
    sequence: int = 1
    data: int = 1
    parallel: str = "allscan"  # the recurrent layers' state scan across the sequence group
    microbatches: int = 2
    kernel_chunk: int = 16  # each rank's slice of a chunk holds whole kernel chunks
    stages: str = ""  # the layer split, where 16 layers do not divide evenly
    recompute: bool = False  # pipeline.recompute = full: B reruns F, its K/V gather included
    attention: str = "allgather"  # the attention layers' K/V exchange across the sequence group

    @property
    def ranks(self) -> int:
        return self.pipeline * self.sequence * self.data

    @property
    def name(self) -> str:
        ring = "_ring_attention" if self.attention == "ring" else ""
        return f"p{self.pipeline}_s{self.sequence}_d{self.data}{ring}{'_recompute' if self.recompute else ''}"


MESHES = (
    Mesh(pipeline=2, microbatches=4),
    Mesh(pipeline=3, microbatches=3, stages="[[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]"),
    Mesh(pipeline=4, microbatches=4),
    Mesh(sequence=2, parallel="allgather"),
    Mesh(sequence=3, parallel="ring"),
    Mesh(sequence=4, parallel="allscan", kernel_chunk=4),
    Mesh(data=2),
    Mesh(data=3),
    Mesh(data=4, microbatches=3),
    Mesh(pipeline=2, sequence=2, parallel="allgather", microbatches=2, recompute=True),
    Mesh(sequence=2, parallel="allgather", attention="ring"),
    Mesh(sequence=3, parallel="ring", attention="ring"),
    Mesh(pipeline=2, sequence=2, parallel="allgather", microbatches=2, recompute=True, attention="ring"),
)
REFERENCE = Mesh(microbatches=1)


def schedule_text(model: str, mesh: Mesh, name: str | None = None) -> str:
    microbatch_size = GLOBAL_BATCH // (mesh.microbatches * mesh.data)
    assert microbatch_size * mesh.microbatches * mesh.data == GLOBAL_BATCH, mesh
    chunks = 1 if mesh == REFERENCE else 2
    return f"""schedule {name or f"{model}_{mesh.name}"}
model {{
  vocab = 64  d_model = 32  heads = 2  head_dim = 16
  layers = [{", ".join(MODELS[model])}] * {REPEATS}
  mlp = swiglu(ratio = 2)
  {f"stages = {mesh.stages}" if mesh.stages else ""}
}}
mesh {{ pipeline = {mesh.pipeline}  sequence = {mesh.sequence}  data = {mesh.data} }}
sequence {{ length = {SEQUENCE_LENGTH}  chunks = {chunks}  kernel_chunk = {mesh.kernel_chunk}  parallel = {mesh.parallel}  attention = {mesh.attention} }}
pipeline {{ microbatches = {mesh.microbatches}  microbatch_size = {microbatch_size}  order = 1f1b  recompute = {"full" if mesh.recompute else "none"} }}
train {{ steps = {STEPS}  seed = 3  optimizer = adamw(lr = 1e-2)  data = synthetic(seed = 4) }}
"""


def runtime_refuses(model: str, mesh: Mesh) -> bool:
    """Whether the runtime's capabilities list refuses this model on this mesh (read at collection)."""
    layers = MODELS[model] * REPEATS
    request = run_request(
        ModelConfig(vocab=64, d_model=32, layers=layers, heads=2, head_dim=16),
        PipelineConfig(
            stage_layers=(tuple(range(len(layers))),),
            chunk_boundaries=(0, SEQUENCE_LENGTH // 2, SEQUENCE_LENGTH),
            microbatches=mesh.microbatches,
            microbatch_size=GLOBAL_BATCH // (mesh.microbatches * mesh.data),
            stage_actions=((),),
            data_parallel=mesh.data,
            recompute="full" if mesh.recompute else "none",
            sequence_parallel=mesh.sequence,
        ),
    )
    return bool(refusals(request))
