"""The memory model's terms: bytes of each thing a pipeline stage keeps, one formula per term.

Every function here is a closed form in the program's sizes (``d`` = ``d_model``, ``H`` heads, ``D`` head
dimension, ``W = H D``, an ``attn`` layer's own ``H_a`` query heads of ``D_a`` and ``W_a = H_a D_a``, its
``H_kv`` key/value heads and ``W_kv = H_kv D_a`` (``ModelConfig.attention_geometry``), ``h`` the SwiGLU width,
``V`` the vocabulary, ``e`` bytes per element of ``train.dtype``, ``f`` bytes of the kernels' compute dtype: 4,
or 8 for fp64) and is what :mod:`schedlang.lowering.memory_peak` adds up along a stage's order.
docs/cost-model.md ("Memory") states every formula and what it assumes; the per-token activation terms are the
tensors autograd saves in ``schedlang.runtime.model``'s layers, checked against the runtime on the CPU by
tests/lowering/test_memory_calibration.py ([Note: activation bytes]).

[Note: activation bytes]
A chunk of ``s`` tokens (per sequence, ``b`` sequences per microbatch, ``S`` sequence-parallel ranks each
holding ``s / S`` of them) keeps ``b s / S`` times the per-token bytes below between its forward and its
backward (its ``W`` task when the backward is split):

* an RMSNorm over ``w`` features: on CUDA torch's fused norm keeps its input (``w e``) and one fp32 ``rstd``
  per row (:attr:`Device.CUDA`); on the CPU the composite norm keeps the input and the normalised rows in fp32
  (``2 w f``) and the ``rstd`` (:attr:`Device.CPU`, what the calibration runs on);
* every token mixer: its norm, the normed input that its projections share (``d e``) and the output
  projection's input (``W e``, ``W_a e`` for attn); then per kind
  gla ``3 W e`` (q, k, v) ``+ W e`` (gate logits) ``+ W f`` (the log-gate) ``+ 2 W e`` with ``output_gate =
  swish`` (the fused per-head norm and gate keeps its values and gate), simple_gla ``3 W e + H e + H f``,
  attn ``W_a e`` (q; k and v live in the sequence-wide K/V buffers, a term of their own) ``+ H_a f`` (the
  log-sum-exp), gdn (``H_v`` value heads of ``D``, ``W_v = H_v D``; ``H`` q/k heads of ``D_k``, ``W_q = H
  D_k``, repeated to ``W_k = H_v D_k`` for the operator; all ``W`` and ``H`` without grouped value heads or
  ``expand_k``) ``(2 W_q + 3 W_v) e + (2 H + 3 H_v) e`` (the raw q and k, the output norm's values and gate
  (the fused norm and gate keeps only its inputs); the q and k norms, the gate and write-strength inputs and
  the write strength), ``+ (2 W_q + W_v) e`` with short convolutions (each one's input; the fused convolution
  recomputes its output in the backward; and ``taps - 1`` history rows per chunk), plus what the chunked
  operator keeps: on the CPU (batched PyTorch) ``f (9 W_k + 3 W_v + 6 C H_v + 5 H_v + H_v D_k D / C + H_v /
  C)`` (the WY form's chunked operands, the ``C x C`` decay and triangular matrices per kernel chunk of ``C =
  64`` tokens, and the states entering each kernel chunk; how many operands are key-wide and how many
  value-wide the calibration separates by varying ``D_k``) plus a ``C x C`` boolean mask per layer and chunk;
  on CUDA (the Triton operator, chunk states not kept) ``(2 W_k + W_v) e`` (its q, k, v) ``+ f H_v (C + 3 + 1
  / C)`` (the ``C x C`` inverse per kernel chunk, the gate cumsum, the gate, the write strength and the chunk
  decay); mamba2 (``G`` groups of ``N``, ``C_w = W + 2 G N``) :func:`mamba2_bytes_per_token`'s terms, measured
  on the CPU in fp32 and bf16, grouped and not; mamba3 (``G`` groups of ``N``, ``A`` rotary angles)
  :func:`mamba3_bytes_per_token`'s terms, measured the same way;
* an MLP (SwiGLU): its norm, the normed input (``d e``), the fused gate-and-up output (``2 h e``) and the
  activation's output (``h e``);
* the last stage's head: the final norm, the head's input (``d e``), the log-softmax over the vocabulary in
  fp32 (``V f``) and the targets (8 bytes).

With packed documents the recurrent operators run over padded rows ([Note: packed documents] in
schedlang.runtime.packing): what the operator saves (:func:`operator_bytes_per_token`) is counted per token it runs
over (:func:`padding_tokens` more than the chunk's), the rest of the layer per token of the chunk.

Recomputation replaces what a part keeps by its input: ``mlp`` keeps ``d e`` per MLP instead of the MLP's
tensors, ``mixer`` ``d e`` per token mixer instead of the mixer's (both through
``torch.utils.checkpoint``, which keeps the part's input), and ``full`` keeps only the chunk's input
(``d e`` on every stage but the first, whose token ids are part of the step's batch) and its initial
states, recomputing the whole chunk inside its backward (a transient there).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from schedlang.lowering.cost import DTYPE_BYTES, compute_bytes
from schedlang.lowering.operator_tokens import RUNTIME_KERNEL_CHUNK, operator_tokens
from schedlang.lowering.parameters import mlp_width, stage_parameters
from schedlang.lowering.program import Recompute, ScheduleProgram
from schedlang.vocabulary import (
    AttentionExchange,
    AttentionGeometry,
    LayerKind,
    MlpKind,
    ModelConfig,
    OptimizerKind,
    OutputGate,
    recompute_on,
)
from schedlang.vocabulary.model_settings import flash_attention_takes

RSTD_BYTES = 4
"""A norm's reciprocal standard deviation is kept in fp32, one per row."""


class Device(str, Enum):
    """Where a chunk runs: the norm keeps different tensors on each ([Note: activation bytes])."""

    CUDA = "cuda"
    CPU = "cpu"


class StaticPart(str, Enum):
    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class GdnGeometry:
    """A gdn layer's widths: ``query_key_heads`` q/k heads of ``key_dim`` (the model's ``heads`` and
    ``head_k_dim``), each repeated for its ``value_heads / query_key_heads`` value heads of ``value_dim`` (the
    model's ``head_dim``) before the operator, and ``conv_taps`` taps of its short convolutions (0: none)."""

    query_key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_taps: int

    @property
    def convolved_width(self) -> int:
        """Channels of the short convolutions, q, k and v together: ``2 W_q + W_v``."""
        return 2 * self.query_key_heads * self.key_dim + self.value_heads * self.value_dim


@dataclass(frozen=True)
class Mamba2Geometry:
    """A mamba2 layer's widths: the model's ``heads`` of ``head_dim`` (``W = H D``, fla's intermediate size),
    ``groups`` B/C groups of ``state_size`` (``N``) and ``conv_taps`` taps over x, B and C."""

    state_size: int
    groups: int
    conv_taps: int

    def convolved_width(self, width: int) -> int:
        """Channels of the convolution, x, B and C together: ``W + 2 G N`` (fla's ``conv_dim``)."""
        return width + 2 * self.groups * self.state_size


@dataclass(frozen=True)
class Mamba3Geometry:
    """A mamba3 layer's widths: ``groups`` B/C groups of ``state_size`` (``N``), ``angles`` rotary angles
    (``A``), ``projected`` features of its input projection (fla's ``d_in_proj``), and whether the output is
    normalised per head (``outproj_norm``)."""

    state_size: int
    groups: int
    angles: int
    projected: int
    outproj_norm: bool


@dataclass(frozen=True)
class Sizes:
    """The sizes every term reads, taken once from a program."""

    d_model: int
    heads: int
    head_dim: int
    mlp_hidden: int
    vocab: int
    element_bytes: int
    compute_bytes: int
    batch: int
    attention: AttentionGeometry  # the heads of the attn layers
    gdn: GdnGeometry  # the heads and widths of the gdn layers
    mamba2: Mamba2Geometry  # the state size, groups and convolution of the mamba2 layers
    mamba3: Mamba3Geometry  # the state size, groups and angles of the mamba3 layers
    sequence_ranks: int = 1  # the mesh's sequence-parallel group
    gla_output_gate: bool = False  # gla layers normalise per head and gate by silu(g_proj(x)) (output_gate = swish)

    @property
    def width(self) -> int:
        return self.heads * self.head_dim


def program_sizes(program: ScheduleProgram) -> Sizes:
    model = program.model
    element = DTYPE_BYTES[program.train.dtype]
    gdn_state = model.state_geometry(LayerKind.GDN)
    mamba3 = model.options.mamba3
    return Sizes(
        d_model=model.d_model,
        heads=model.heads,
        head_dim=model.head_dim,
        mlp_hidden=mlp_width(model),
        vocab=model.vocab,
        element_bytes=element,
        compute_bytes=compute_bytes(program.train.dtype),
        batch=program.pipeline.microbatch_size,
        attention=model.attention_geometry,
        gdn=GdnGeometry(
            query_key_heads=model.heads,
            value_heads=gdn_state.heads,
            key_dim=gdn_state.key_dim,
            value_dim=gdn_state.value_dim,
            conv_taps=model.options.gdn.short_conv_size or 0,
        ),
        mamba2=Mamba2Geometry(model.options.mamba2.state_size, model.options.mamba2.n_groups, model.options.mamba2.conv_kernel),
        mamba3=Mamba3Geometry(
            state_size=mamba3.state_size,
            groups=mamba3.n_groups,
            angles=mamba3.angle_count(),
            projected=mamba3.projected_width(model.heads, model.head_dim),
            outproj_norm=mamba3.is_outproj_norm,
        ),
        sequence_ranks=program.mesh.sequence,
        gla_output_gate=model.options.gla.output_gate is OutputGate.SWISH,
    )


def norm_bytes_per_row(width: int, sizes: Sizes, device: Device) -> float:
    """What an RMSNorm over ``width`` features keeps for its backward, per row."""
    if device is Device.CUDA:
        return width * sizes.element_bytes + RSTD_BYTES
    return 2 * width * sizes.compute_bytes + RSTD_BYTES


def mixer_bytes_per_token(kind: LayerKind, sizes: Sizes, device: Device) -> float:
    """A token mixer's saved bytes per token, its norm included ([Note: activation bytes])."""
    d, heads, width = sizes.d_model, sizes.heads, sizes.width
    e, f = sizes.element_bytes, sizes.compute_bytes
    normed_input = norm_bytes_per_row(d, sizes, device) + d * e
    if kind is LayerKind.ATTN:  # the output projection's input and q, then the log-sum-exp
        attention = sizes.attention
        return normed_input + 2 * attention.query_width * e + attention.heads * f
    shared = normed_input + width * e + operator_bytes_per_token(kind, sizes, device)
    if kind is LayerKind.GLA:  # the gate logits; with an output gate the fused norm's values and gate
        return shared + width * e + (2 * width * e if sizes.gla_output_gate else 0)
    if kind is LayerKind.SIMPLE_GLA:
        return shared + heads * e
    if kind is LayerKind.GDN:
        return normed_input + gdn_bytes_per_token(sizes, device)
    if kind is LayerKind.MAMBA2:
        return normed_input + mamba2_bytes_per_token(sizes, device)
    if kind is LayerKind.MAMBA3:
        return normed_input + mamba3_bytes_per_token(sizes)
    return 0.0


def operator_bytes_per_token(kind: LayerKind, sizes: Sizes, device: Device) -> float:
    """The part of :func:`mixer_bytes_per_token` that a recurrent layer's chunked operator saves (its q, k, v,
    log-gate and what it keeps of its own), per token it runs over: with packed documents, per padded token
    (:func:`schedlang.lowering.operator_tokens.operator_tokens`). 0 for other kinds."""
    width, e, f = sizes.width, sizes.element_bytes, sizes.compute_bytes
    if kind is LayerKind.GLA:
        return 3 * width * e + width * f
    if kind is LayerKind.SIMPLE_GLA:
        return 3 * width * e + sizes.heads * f
    if kind is LayerKind.GDN:
        return gdn_operator_bytes_per_token(sizes, device)
    if kind is LayerKind.MAMBA2:
        return mamba2_operator_bytes_per_token(sizes, device)
    if kind is LayerKind.MAMBA3:
        return mamba3_operator_bytes_per_token(sizes)
    return 0.0


def mamba2_bytes_per_token(sizes: Sizes, device: Device) -> float:
    """A mamba2 layer's saved bytes per token after its normed input ([Note: activation bytes]), ``C_w = W + 2 G
    N`` the convolution's channels: the input projection's output (``(W + C_w + H) e``), which the convolution
    (its x, B, C columns) and the gated norm (its gate z) keep as views, each recomputing the rest in its
    backward (kernels/short_convolution, kernels/gated_rms_norm; the history rows: stage_chunk_constant_bytes);
    the convolution's output, which x, B, C and the ``D`` skip view (``C_w e``; the fused ``v = dt x`` and skip
    keep x itself, no wider copy); the time step twice (``2 H f``); the norm's values (``W e``); the output
    projection's input (``W e``); and the operator's part."""
    mamba2, e, f = sizes.mamba2, sizes.element_bytes, sizes.compute_bytes
    width, heads = sizes.width, sizes.heads
    convolved = mamba2.convolved_width(width)
    kept = (width + convolved + heads) * e + convolved * e + 2 * heads * f + 2 * width * e
    return kept + mamba2_operator_bytes_per_token(sizes, device)


def mamba3_bytes_per_token(sizes: Sizes) -> float:
    """A mamba3 layer's saved bytes per token after its normed input ([Note: activation bytes]), ``P`` its
    projection's width, ``N`` the state size, ``G`` the B/C groups, ``A`` the angles: the projection's output,
    which z, x, B, C and the per-head inputs view (``P e``); B and C normalised per group (``2 G N f`` and ``G``
    fp32 ``rstd`` each; in a 16-bit model also their fp32 copies, ``2 G N f``), repeated for their heads with
    their biases (``2 H N f``) and rotated (``2 H N f`` in a 16-bit model, where the operator reads copies; in
    a 32-bit model the rotated key, whose scaled copy and the rotated query the operator reads: ``H N f``); the
    angles, their rates and ``theta`` and its cosine and sine for each of the two rotations (``2 A f + 5 H A
    f``); ten per-head values in fp32 (softplus, clamp, dt, ``A dt``, the trapezoid's weights; eleven in a
    16-bit model); the mixed values and the gate's SiLU (``2 W f``; ``5 W f`` in a 16-bit model, x's fp32
    copies), with ``is_outproj_norm`` the norm's input and output and ``H`` ``rstd`` (``2 W f + H RSTD``);
    the output projection's input (``W e``); and the operator's part."""
    mamba3, e, f = sizes.mamba3, sizes.element_bytes, sizes.compute_bytes
    width, heads, size = sizes.width, sizes.heads, mamba3.state_size
    widened = e != f
    kept = mamba3.projected * e + 2 * mamba3.groups * ((2 if widened else 1) * size * f + RSTD_BYTES)
    kept += (4 if widened else 3) * heads * size * f
    kept += 2 * mamba3.angles * f + 5 * heads * mamba3.angles * f + (11 if widened else 10) * heads * f
    kept += (5 if widened else 2) * width * f + width * e
    if mamba3.outproj_norm:
        kept += 2 * width * f + heads * RSTD_BYTES
    return kept + mamba3_operator_bytes_per_token(sizes)


def mamba3_operator_bytes_per_token(sizes: Sizes) -> float:
    """What a mamba3 layer's chunked operator (simple GLA's) reads and saves per token it runs over: the
    rotated query and the scaled rotated key as it reads them (``2 H N e``) and the log decay (``H f``)."""
    return 2 * sizes.heads * sizes.mamba3.state_size * sizes.element_bytes + sizes.heads * sizes.compute_bytes


def mamba2_operator_bytes_per_token(sizes: Sizes, device: Device) -> float:
    """What a mamba2 layer's chunked operator (simple GLA's) saves per token it runs over: ``v = dt x``
    (``W e``), the log decay (``H f``), and C and B. The Triton kernels of one sequence rank read C and B by
    group, views of the convolution's output counted there; the PyTorch path (CPU) and the sequence-parallel
    scans take them repeated for their heads (``2 H N e``; none where ``G = H``)."""
    mamba2, e, f = sizes.mamba2, sizes.element_bytes, sizes.compute_bytes
    per_head = device is Device.CPU or sizes.sequence_ranks > 1
    repeated = 2 * sizes.heads * mamba2.state_size * e if per_head and mamba2.groups < sizes.heads else 0
    return repeated + sizes.width * e + sizes.heads * f


def gdn_bytes_per_token(sizes: Sizes, device: Device) -> float:
    """A gdn layer's saved bytes per token after its normed input ([Note: activation bytes]): ``H_v`` value
    heads of ``D`` (``W_v = H_v D``), ``H_q`` q/k heads of ``D_k`` (``W_q = H_q D_k``), which the CPU operator
    keeps repeated to ``W_k = H_v D_k`` and the Triton operator as they are."""
    gdn, e = sizes.gdn, sizes.element_bytes
    heads, query_heads = gdn.value_heads, gdn.query_key_heads
    value_width, query_width = heads * sizes.head_dim, query_heads * gdn.key_dim
    # the raw q and k, the output projection's input, the output norm's values and its gate (the fused norm
    # recomputes the rest, kernels/gated_rms_norm); the q and k norms, the gate and write-strength inputs and the
    # write strength
    kept = (2 * query_width + 3 * value_width) * e + (2 * query_heads + 3 * heads) * e
    if gdn.conv_taps:  # each short convolution's input (its history rows: stage_chunk_constant_bytes)
        kept += gdn.convolved_width * e
    return kept + gdn_operator_bytes_per_token(sizes, device)


def gdn_operator_bytes_per_token(sizes: Sizes, device: Device) -> float:
    """What a gdn layer's chunked operator saves per token it runs over ([Note: activation bytes])."""
    gdn, dim = sizes.gdn, sizes.head_dim
    e, f, chunk = sizes.element_bytes, sizes.compute_bytes, RUNTIME_KERNEL_CHUNK
    heads = gdn.value_heads
    value_width, query_width, key_width = heads * dim, gdn.query_key_heads * gdn.key_dim, heads * gdn.key_dim
    if device is Device.CUDA:  # the Triton operator's autograd Function (kernels/gdn/chunk_triton.py): q, k narrow
        return (2 * query_width + value_width) * e + f * heads * (chunk + 3 + 1 / chunk)
    chunked = 9 * key_width + 3 * value_width + 6 * chunk * heads + 5 * heads + key_width * dim / chunk + heads / chunk
    return f * chunked


def mlp_bytes_per_token(sizes: Sizes, device: Device) -> float:
    """A SwiGLU MLP's saved bytes per token, its norm included."""
    e = sizes.element_bytes
    return norm_bytes_per_row(sizes.d_model, sizes, device) + sizes.d_model * e + 3 * sizes.mlp_hidden * e


def head_bytes_per_token(sizes: Sizes, device: Device) -> float:
    """The last stage's final norm, LM head and loss, per token: the norm's saved input and the gradient of
    the norm's output that the fused head and loss form in its forward ([Note: fused head and loss] in
    schedlang.runtime.linear_cross_entropy; the head's weight gradient is :func:`head_chunk_bytes`)."""
    return norm_bytes_per_row(sizes.d_model, sizes, device) + sizes.d_model * sizes.element_bytes


def head_chunk_bytes(sizes: Sizes) -> float:
    """What the fused head and loss keep per chunk beyond :func:`head_bytes_per_token`: the head's weight
    gradient, formed in the forward, in the weight's dtype (``V d e``)."""
    return sizes.vocab * sizes.d_model * sizes.element_bytes


def layer_bytes_per_token(
    model: ModelConfig, kind: LayerKind, sizes: Sizes, recompute: Recompute, device: Device
) -> float:
    """One layer's saved bytes per token under ``recompute`` (``full`` is the stage's business: 0 here)."""
    if recompute is Recompute.FULL:
        return 0.0
    input_bytes = sizes.d_model * sizes.element_bytes
    total = 0.0
    if kind.is_mixer:
        total += input_bytes if recompute is Recompute.MIXER else mixer_bytes_per_token(kind, sizes, device)
    if model.has_mlp(kind) and model.mlp_kind is not MlpKind.NONE:
        total += input_bytes if recompute is Recompute.MLP else mlp_bytes_per_token(sizes, device)
    return total


def stage_layer_kinds(program: ScheduleProgram, stage: int) -> tuple[LayerKind, ...]:
    return tuple(program.model.layers[layer] for layer in program.stage_layers[stage])


def local_tokens(program: ScheduleProgram, chunk: int) -> float:
    """Tokens of one chunk a rank holds: ``b s / S``."""
    return program.pipeline.microbatch_size * program.sequence.chunk_length(chunk) / program.mesh.sequence


def padding_tokens(program: ScheduleProgram, chunk: int) -> float:
    """Tokens a rank's recurrent operators run over for one chunk beyond its own: the packed documents' pads and
    reset tokens, ``b (s' - s) / S`` with ``s'`` :func:`schedlang.lowering.operator_tokens.operator_tokens`
    (0 without packed documents)."""
    padding = operator_tokens(program, chunk) - program.sequence.chunk_length(chunk)
    return program.pipeline.microbatch_size * padding / program.mesh.sequence


def stage_bytes_per_token(
    program: ScheduleProgram, stage: int, recompute: Recompute, device: Device = Device.CUDA
) -> float:
    """Saved bytes per local token of a chunk on ``stage`` under ``recompute`` (the K/V buffers and the
    recurrent states are terms of their own)."""
    sizes = program_sizes(program)
    if recompute is Recompute.FULL:
        return 0.0 if stage == 0 else sizes.d_model * sizes.element_bytes
    total = sum(
        layer_bytes_per_token(program.model, kind, sizes, recompute, device)
        for kind in stage_layer_kinds(program, stage)
    )
    if stage == program.n_stages - 1:
        total += head_bytes_per_token(sizes, device)
    return total


def stage_operator_bytes_per_token(
    program: ScheduleProgram, stage: int, recompute: Recompute, device: Device = Device.CUDA
) -> float:
    """The part of :func:`stage_bytes_per_token` that the stage's recurrent operators save, per token they run
    over: none when ``recompute`` keeps only the token mixers' inputs (``mixer``, ``full``)."""
    if recompute in (Recompute.FULL, Recompute.MIXER):
        return 0.0
    sizes = program_sizes(program)
    return sum(operator_bytes_per_token(kind, sizes, device) for kind in stage_layer_kinds(program, stage))


def stage_chunk_constant_bytes(program: ScheduleProgram, stage: int, recompute: Recompute, device: Device) -> float:
    """Saved bytes of a chunk that are not per token: on the last stage :func:`head_chunk_bytes`; per GDN layer: on the CPU its ``C x C`` causal mask (the
    Triton operator on CUDA keeps none), and with short convolutions the ``taps - 1`` history rows each
    convolution keeps beside its input (from a chunk's incoming state: none for a sequence's first chunk, which
    starts from zeros); per mamba2 layer those history rows of its one convolution. (Attention in parts saves no mask of the chunk's
    queries against the prefix: [Note: attention in parts] in schedlang.runtime.attention_parts.)"""
    sizes = program_sizes(program)
    head = head_chunk_bytes(sizes) if stage == program.n_stages - 1 and recompute is not Recompute.FULL else 0.0
    if recompute in (Recompute.FULL, Recompute.MIXER):
        return head
    gdn = sizes.gdn
    mask = RUNTIME_KERNEL_CHUNK * RUNTIME_KERNEL_CHUNK if device is Device.CPU else 0
    history = sizes.batch * max(gdn.conv_taps - 1, 0) * gdn.convolved_width * sizes.element_bytes
    mamba2 = sizes.mamba2
    mamba2_history = sizes.batch * max(mamba2.conv_taps - 1, 0) * mamba2.convolved_width(sizes.width)
    mamba2_history *= sizes.element_bytes
    kinds = stage_layer_kinds(program, stage)
    gdn_layers, mamba2_layers = (sum(kind is wanted for kind in kinds) for wanted in (LayerKind.GDN, LayerKind.MAMBA2))
    return gdn_layers * (mask + history) + mamba2_layers * mamba2_history + head


def chunk_activation_bytes(
    program: ScheduleProgram, stage: int, chunk: int, recompute: Recompute | None = None, device: Device = Device.CUDA
) -> float:
    """What chunk ``chunk`` keeps on ``stage`` from its forward to its backward ([Note: activation bytes]), the
    recurrent operators' part over the padded rows of packed documents (:func:`padding_tokens`)."""
    recompute = recompute_on(program.pipeline.recompute, stage) if recompute is None else recompute
    tokens = local_tokens(program, chunk)
    per_token = stage_bytes_per_token(program, stage, recompute, device)
    padding = padding_tokens(program, chunk) * stage_operator_bytes_per_token(program, stage, recompute, device)
    return tokens * per_token + padding + stage_chunk_constant_bytes(program, stage, recompute, device)


def state_bytes(program: ScheduleProgram, stage: int) -> float:
    """One chunk boundary's recurrent states on ``stage``: every recurrent layer's whole state
    (``ModelConfig.state_geometry``: its matrix, and a gdn layer's short-convolution history), float32."""
    sizes = program_sizes(program)
    elements = sum(
        program.model.state_geometry(kind).elements for kind in stage_layer_kinds(program, stage) if kind.is_recurrent
    )
    return elements * sizes.batch * sizes.compute_bytes


def key_value_bytes(program: ScheduleProgram, stage: int) -> float:
    """One microbatch's sequence-wide K and V buffers on ``stage``: ``2 b T W_kv e`` per attn layer
    ([Note: sequence-wide K/V] in schedlang.runtime.kv_buffers), the buffers as wide as the key/value heads
    (``AttentionGeometry.buffered_key_value_width``); their gradient buffers, opened by the microbatch's first
    backward, weigh as much again."""
    sizes = program_sizes(program)
    attention = sum(kind is LayerKind.ATTN for kind in stage_layer_kinds(program, stage))
    width = sizes.attention.buffered_key_value_width
    return attention * 2 * sizes.batch * program.sequence.length * width * sizes.element_bytes


def activation_message_bytes(program: ScheduleProgram, chunk: int) -> float:
    """One activation or activation gradient between stages: ``b s / S d e``."""
    return local_tokens(program, chunk) * program.model.d_model * DTYPE_BYTES[program.train.dtype]


OPTIMIZER_STATES = {OptimizerKind.ADAMW: 2, OptimizerKind.SGD: 1}
"""Tensors the optimizer keeps per parameter it updates: AdamW's two moments; SGD's momentum buffer (none
when ``momentum = 0``)."""

MASTER_BYTES = 4
"""Bytes per element of the fp32 master weights, their gradients and the optimizer's state."""


def updated_element_bytes(program: ScheduleProgram) -> int:
    """Bytes per element of what the optimizer updates, of its gradients and of its state: fp32 with master
    weights, else ``train.dtype``."""
    return MASTER_BYTES if program.train.keeps_master_weights else DTYPE_BYTES[program.train.dtype]


def reduced_gradient_bytes(program: ScheduleProgram, stage: int) -> float:
    """The gradients the step's all-reduce flattens (``Trainer.reduce_gradients``): the optimizer's."""
    return stage_parameters(program, stage).total * updated_element_bytes(program)


def static_bytes(program: ScheduleProgram, stage: int) -> dict[StaticPart, float]:
    """Parameters, their gradients (``.grad`` stays allocated between steps: the runtime zeroes it in
    place) and the optimizer's state, made ``zeros_like`` the parameters it updates.

    Without master weights all are in ``train.dtype`` (``e`` bytes). With them (``train.keeps_master_weights``,
    [Note: master weights] in schedlang.runtime.master_weights) the stage holds the 16-bit parameters and
    ``.grad`` tensors the layers compute with, plus an fp32 copy of each, and the optimizer's state is fp32:
    ``(e + 4)`` bytes per parameter for the parameters and for the gradients, ``4`` per optimizer state."""
    element = DTYPE_BYTES[program.train.dtype]
    parameters = stage_parameters(program, stage).total
    optimizer = program.train.optimizer
    states = OPTIMIZER_STATES[optimizer.kind]
    if optimizer.kind is OptimizerKind.SGD and optimizer.momentum == 0:
        states = 0
    master = MASTER_BYTES if program.train.keeps_master_weights else 0
    return {
        StaticPart.PARAMETERS: parameters * (element + master),
        StaticPart.GRADIENTS: parameters * (element + master),
        StaticPart.OPTIMIZER: states * parameters * updated_element_bytes(program),
    }


def layer_workspace_bytes_per_token(model: ModelConfig, kind: LayerKind, sizes: Sizes, device: Device) -> float:
    """The temporaries of one layer's backward, per token: the gradients of what it saved (as large as the
    saved tensors) and, for a recurrent layer, the states entering each kernel chunk that its backward
    recomputes (its state matrix, ``ModelConfig.state_geometry``, over ``C`` tokens, in fp32)."""
    saved = layer_bytes_per_token(model, kind, sizes, Recompute.NONE, device)
    return saved + recomputed_state_bytes_per_token(model, kind, sizes)


def recomputed_state_bytes_per_token(model: ModelConfig, kind: LayerKind, sizes: Sizes) -> float:
    """The states entering each kernel chunk that a recurrent layer's backward recomputes, per token its
    operator runs over (0 for other kinds)."""
    if not kind.is_recurrent:
        return 0.0
    return model.state_geometry(kind).matrix_elements * sizes.compute_bytes / RUNTIME_KERNEL_CHUNK


def operator_workspace_bytes_per_token(model: ModelConfig, kind: LayerKind, sizes: Sizes, device: Device) -> float:
    """The part of :func:`layer_workspace_bytes_per_token` per token the recurrent operator runs over: the
    gradients of what it saved and the recomputed states."""
    return operator_bytes_per_token(kind, sizes, device) + recomputed_state_bytes_per_token(model, kind, sizes)


def head_workspace_bytes(sizes: Sizes, tokens: float) -> float:
    """The fused head and loss's temporaries for a chunk of ``tokens`` local rows ([Note: fused head and loss]
    in schedlang.runtime.linear_cross_entropy), the larger of its forward's and its backward's. The forward
    holds one block's logits, their float32 copy and their gradient (``B V (2 e + f)``, ``B V f`` when
    ``e = f``; ``B`` the smaller of ``tokens`` and the runtime's block) and, over several blocks, the weight
    gradient's float32 sum with one block's term (``V d (f + e)``; ``V d e`` for one block or ``e = f``); the
    backward the scaled gradients of the hidden states and the weight (``t d e + V d e``)."""
    from schedlang.runtime.linear_cross_entropy import loss_block_tokens

    e, f, vocab, d_model = sizes.element_bytes, sizes.compute_bytes, sizes.vocab, sizes.d_model
    block = min(tokens, loss_block_tokens(vocab))
    logits = block * vocab * (f if e == f else 2 * e + f)
    several_blocks = tokens > block and e != f
    weight_sum = vocab * d_model * (f + e if several_blocks else e)
    backward = tokens * d_model * e + vocab * d_model * e
    return max(logits + weight_sum, backward)


def attention_read_bytes(program: ScheduleProgram, chunk: int, device: Device) -> float:
    """What one attn layer's backward of chunk ``chunk`` holds while its kernels read grouped key/value heads
    at query-head width ([Note: grouped key/value heads] in schedlang.runtime.attention_parts): the longest
    part's keys and values and their gradients, ``4 b P W_a x``, ``P`` the longer of the slowest rank's prefix
    (every key before its slice) and its slice, ``x`` the kernels' element bytes (``e`` on the CPU and for 16-bit
    heads flash attention takes, :func:`~schedlang.vocabulary.model_settings.flash_attention_takes`; ``f``
    otherwise on CUDA). None without groups: the kernels read the buffers themselves."""
    sizes = program_sizes(program)
    if not sizes.attention.is_grouped:
        return 0.0
    length = program.sequence.chunk_length(chunk)
    last_slice = -(-length // program.mesh.sequence)
    longest = max(program.sequence.boundaries[chunk] + length - last_slice, last_slice)
    flash = sizes.element_bytes == 2 and flash_attention_takes(sizes.attention.head_dim)
    element = sizes.compute_bytes if device is Device.CUDA and not flash else sizes.element_bytes
    return 4 * sizes.batch * longest * sizes.attention.read_key_value_width * element


def transient_bytes(program: ScheduleProgram, stage: int, chunk: int, device: Device = Device.CUDA) -> float:
    """The most a single task on ``stage`` allocates beyond what outlives it, for chunk ``chunk``: the
    largest layer's backward workspace (an attn layer's with :func:`attention_read_bytes`, a recurrent layer's
    operator part over the padded rows of packed documents: :func:`padding_tokens`; or the head's),
    the output and input gradients of the chunk (``2 b s / S d e``), sequence-parallel messages, and what the
    backward rebuilds: under ``recompute = full`` the whole chunk's activations, under ``mlp`` or ``mixer``
    the largest such part."""
    sizes = program_sizes(program)
    tokens, padding = local_tokens(program, chunk), padding_tokens(program, chunk)
    kinds = set(stage_layer_kinds(program, stage))
    workspaces = [
        tokens * layer_workspace_bytes_per_token(program.model, kind, sizes, device)
        + padding * operator_workspace_bytes_per_token(program.model, kind, sizes, device)
        + (attention_read_bytes(program, chunk, device) if kind is LayerKind.ATTN else 0.0)
        for kind in kinds
    ]
    if stage == program.n_stages - 1:
        workspaces.append(head_workspace_bytes(sizes, tokens))
    workspace = max(workspaces, default=0.0) + tokens * 2 * sizes.d_model * sizes.element_bytes
    recompute = recompute_on(program.pipeline.recompute, stage)
    if recompute is Recompute.FULL:
        workspace += chunk_activation_bytes(program, stage, chunk, Recompute.NONE, device)
    elif recompute in (Recompute.MLP, Recompute.MIXER):
        rebuilt = [
            tokens * recomputed_part_bytes_per_token(kind, sizes, recompute, device)
            + (padding * operator_bytes_per_token(kind, sizes, device) if recompute is Recompute.MIXER else 0.0)
            for kind in kinds
        ]
        workspace += max(rebuilt, default=0.0)
    return workspace + sequence_parallel_bytes(program, stage, chunk)


def recomputed_part_bytes_per_token(kind: LayerKind, sizes: Sizes, recompute: Recompute, device: Device) -> float:
    """What a layer's backward rebuilds under ``recompute = mlp`` or ``mixer`` before it can run: the part's
    saved tensors (a SwiGLU MLP's, or the token mixer's)."""
    if recompute is Recompute.MIXER:
        return mixer_bytes_per_token(kind, sizes, device)
    if recompute is Recompute.MLP and sizes.mlp_hidden:
        return mlp_bytes_per_token(sizes, device)
    return 0.0


def key_value_exchange_bytes(program: ScheduleProgram, chunk: int) -> float:
    """One attn layer's K/V in flight while it exchanges ``chunk`` across the sequence-parallel group, as wide as
    its K/V buffers (its key/value heads): the all-gather's whole chunk, ``2 b s_i W_kv e``; the ring's one
    slice arriving and one leaving, ``2 x 2 b ceil(s_i / S) W_kv e`` ([Note: sequence-parallel attention] in
    schedlang.runtime.attention_parallel)."""
    sizes = program_sizes(program)
    ranks, tokens = program.mesh.sequence, program.sequence.chunk_length(chunk)
    if program.sequence.attention is AttentionExchange.RING:
        tokens = 2 * -(-tokens // ranks)
    return 2 * sizes.batch * tokens * sizes.attention.buffered_key_value_width * sizes.element_bytes


def sequence_parallel_bytes(program: ScheduleProgram, stage: int, chunk: int) -> float:
    """Messages of one layer's exchange across the sequence-parallel group: a state in and a state out
    per recurrent layer (the scan runs layer by layer, so one layer's, the widest: a gdn layer's of its value
    heads), and an attn layer's K/V in flight (:func:`key_value_exchange_bytes`)."""
    ranks = program.mesh.sequence
    if ranks == 1:
        return 0.0
    kinds = set(stage_layer_kinds(program, stage))
    sizes = program_sizes(program)
    widest = max((program.model.state_geometry(kind).matrix_elements for kind in kinds if kind.is_recurrent), default=0)
    recurrent = 2 * sizes.batch * widest * sizes.compute_bytes
    attention = key_value_exchange_bytes(program, chunk) if LayerKind.ATTN in kinds else 0.0
    return max(recurrent, attention)
