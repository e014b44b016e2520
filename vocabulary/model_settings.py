"""The model record a schedule's ``model`` block fills, and the shapes derived from it.

One record serves every stage: the checker builds it from the ``model`` keys, the program holds it
(``ScheduleProgram.model``), the cost and memory models read it, codegen writes it into the training script
as a constructor of literals, and the runtime builds the network from it. :data:`MODEL_KEYS`, after the
records, is the key schema's rows of the ``model`` block (``schedlang.vocabulary.keys``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedlang.vocabulary.keys import REQUIRED, Boolean, Choice, Derived, Integer, Key, Number, Structured
from schedlang.vocabulary.kinds import DeltaGates, LayerKind, MlpKind, OutputGate
from schedlang.vocabulary.model_options import AttentionOptions, ModelOptions


FLASH_MAX_HEAD_DIM = 256


def flash_attention_takes(head_dim: int) -> bool:
    """Whether CUDA's flash attention takes heads ``head_dim`` wide (a multiple of 8, at most 256): then 16-bit
    attention runs it in the inputs' dtype, else the float32 memory-efficient kernels ([Note: attention in parts]
    in schedlang.runtime.attention_parts)."""
    return head_dim % 8 == 0 and head_dim <= FLASH_MAX_HEAD_DIM


@dataclass(frozen=True)
class AttentionGeometry:
    """The head layout of a model's ``attn`` layers: ``heads`` query heads and ``kv_heads`` key/value heads,
    all ``head_dim`` wide (:func:`attention_geometry` derives it)."""

    heads: int
    kv_heads: int
    head_dim: int

    @property
    def query_width(self) -> int:
        """Features of a token's queries, and of the attention output the output projection reads."""
        return self.heads * self.head_dim

    @property
    def key_value_width(self) -> int:
        """Features of a token's keys (and of its values) as the k and v projections produce them."""
        return self.kv_heads * self.head_dim

    @property
    def is_grouped(self) -> bool:
        """Whether key/value heads are shared by several query heads (grouped-query attention)."""
        return self.kv_heads < self.heads

    @property
    def buffered_key_value_width(self) -> int:
        """Features of a token's keys (and of its values) in the sequence-wide K/V buffers, their gradient
        buffers and the sequence-parallel all-gather: the ``kv_heads`` heads the projections make ([Note:
        sequence-wide K/V] in schedlang.runtime.kv_buffers)."""
        return self.key_value_width

    @property
    def read_key_value_width(self) -> int:
        """Features of a token's keys (and of its values) as the attention kernels read them: each key/value
        head repeated for its query heads, so ``heads`` wide; with groups a copy of one part per kernel call,
        per layer at a time ([Note: grouped key/value heads] in schedlang.runtime.attention_parts)."""
        return self.query_width


def attention_geometry(heads: int, head_dim: int, options: AttentionOptions) -> AttentionGeometry:
    """The ``attn`` layers' heads: ``options.heads`` and ``options.head_dim``, each None falling back to the
    model's ``heads`` and ``head_dim``, and ``options.kv_heads``, None falling back to the query heads."""
    query_heads = options.heads or heads
    return AttentionGeometry(
        heads=query_heads, kv_heads=options.kv_heads or query_heads, head_dim=options.head_dim or head_dim
    )


@dataclass(frozen=True)
class RecurrentStateGeometry:
    """What one recurrent layer carries across a chunk, stage or sequence-rank boundary, per batch row, by the
    rule its mixer builds it with (:func:`recurrent_state_geometry`): a ``[heads, key_dim, value_dim]`` state
    matrix, then ``history_rows`` of its short convolutions' last inputs, ``history_channels`` features each
    ([Note: short-convolution state] in schedlang.runtime.short_convolution); ``transition_elements``: one
    rank's transition over its span, which the sequence-parallel all-gather sends beside the state ([Note:
    transitions] in schedlang.runtime.scan_common)."""

    heads: int
    key_dim: int
    value_dim: int
    transition_elements: int
    history_rows: int = 0
    history_channels: int = 0

    @property
    def matrix_elements(self) -> int:
        """Elements of the state matrix: what the cross-rank scan passes."""
        return self.heads * self.key_dim * self.value_dim

    @property
    def elements(self) -> int:
        """Elements of the whole state: what the state store keeps and a stage boundary passes."""
        return self.matrix_elements + self.history_rows * self.history_channels


def recurrent_state_geometry(
    kind: LayerKind, heads: int, head_dim: int, options: ModelOptions
) -> RecurrentStateGeometry | None:
    """The state of a ``kind`` layer of a model with ``heads`` heads of ``head_dim`` (None for a layer without
    one). GLA: ``heads`` heads of ``gla.head_k_dim`` keys, a decay per key row; simple GLA: ``head_dim`` keys,
    a decay per head; Gated DeltaNet: ``gdn.value_heads_of(heads)`` heads of ``gdn.head_k_dim`` keys, a
    ``[key_dim, key_dim]`` transition per head, and with short convolutions ``short_conv_size - 1`` history
    rows of its q, k and v inputs (``2 heads key_dim + value_heads head_dim`` features); Mamba-2: ``heads``
    heads of ``mamba2.state_size`` keys and ``head_dim`` values (simple GLA's state), a decay per head, and
    ``conv_kernel - 1`` history rows of its x, B and C inputs (``mamba2.convolved_width`` features); Mamba-3:
    the same SSD state of ``mamba3.state_size`` keys, a decay per head, and one row of what it carries beside
    it, per head the cumulative rotary angles, the last token's rotated key and its input (``angle_count +
    state_size + head_dim`` features a head)."""
    if kind is LayerKind.GLA:
        key_dim = options.gla.head_k_dim or head_dim
        return RecurrentStateGeometry(heads, key_dim, head_dim, transition_elements=heads * key_dim)
    if kind is LayerKind.SIMPLE_GLA:
        return RecurrentStateGeometry(heads, head_dim, head_dim, transition_elements=heads)
    if kind is LayerKind.GDN:
        gdn = options.gdn
        value_heads, key_dim = gdn.value_heads_of(heads), gdn.head_k_dim or head_dim
        taps = gdn.short_conv_size
        return RecurrentStateGeometry(
            value_heads,
            key_dim,
            head_dim,
            transition_elements=value_heads * key_dim * key_dim,
            history_rows=taps - 1 if taps else 0,
            history_channels=2 * heads * key_dim + value_heads * head_dim if taps else 0,
        )
    if kind is LayerKind.MAMBA2:
        mamba2 = options.mamba2
        return RecurrentStateGeometry(
            heads,
            mamba2.state_size,
            head_dim,
            transition_elements=heads,
            history_rows=mamba2.conv_kernel - 1,
            history_channels=mamba2.convolved_width(heads, head_dim),
        )
    if kind is LayerKind.MAMBA3:
        mamba3 = options.mamba3
        return RecurrentStateGeometry(
            heads,
            mamba3.state_size,
            head_dim,
            transition_elements=heads,
            history_rows=1,
            history_channels=heads * (mamba3.angle_count() + mamba3.state_size + head_dim),
        )
    return None


@dataclass(frozen=True)
class ModelConfig:
    """The language model: embedding, ``layers`` blocks, final RMSNorm, LM head.

    ``mlp_ratio`` is the SwiGLU hidden width over ``d_model`` (the width is
    rounded up to a multiple of 8, see ``model.swiglu_width``); 0 means blocks
    without an MLP. When ``layers`` holds ``mlp`` layers, the MLPs are those
    layers and the mixing layers hold none (``[gla, mlp] * L`` is the network of
    ``[gla] * L``, cut finer).
    """

    vocab: int
    d_model: int
    layers: tuple[LayerKind, ...]
    heads: int
    head_dim: int
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-6
    options: ModelOptions = field(default_factory=ModelOptions)  # flash-linear-attention's GLA and more

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(LayerKind(kind) for kind in self.layers))
        if LayerKind.MLP in self.layers and self.mlp_ratio <= 0:
            raise ValueError("mlp layers need an MLP: mlp_ratio must be > 0")

    @property
    def mlp_kind(self) -> MlpKind:
        """``model.mlp`` as the language names it: ``none`` is an ``mlp_ratio`` of 0."""
        return MlpKind.SWIGLU if self.mlp_ratio > 0 else MlpKind.NONE

    @property
    def separate_mlp(self) -> bool:
        """Whether the MLPs are layers of their own ([Note: separate MLP layers])."""
        return LayerKind.MLP in self.layers

    def has_mlp(self, kind: LayerKind) -> bool:
        """Whether a layer of ``kind`` holds the MLP."""
        if kind is LayerKind.MLP:
            return True
        return self.mlp_ratio > 0 and not self.separate_mlp

    def state_geometry(self, kind: LayerKind) -> RecurrentStateGeometry | None:
        """The state a ``kind`` layer carries (:func:`recurrent_state_geometry`); None for a layer without one."""
        return recurrent_state_geometry(kind, self.heads, self.head_dim, self.options)

    @property
    def attention_geometry(self) -> AttentionGeometry:
        """The head layout of the ``attn`` layers (:func:`attention_geometry`)."""
        return attention_geometry(self.heads, self.head_dim, self.options.attention)

    @property
    def init_depth(self) -> int:
        """``2 x`` the mixing layers: output projections start at std ``0.02 / sqrt(init_depth)`` (GPT-2's scaling
        for a stack of mixer-and-MLP blocks), the same for ``[gla] * L`` and ``[gla, mlp] * L``."""
        return max(1, 2 * sum(kind is not LayerKind.MLP for kind in self.layers))


# Limits that keep a typo such as `head_dim = 100000000` from exhausting memory.
MAX_HEAD_DIM = 1024
MAX_SHORT_CONV_SIZE = 64
EVEN_SPLIT = Derived("the layers split evenly over the mesh.pipeline stages")
HEAD_WIDTH = Derived("heads * head_dim / d_model")


def _mlp_text(value: tuple[float, int | None]) -> str:
    ratio, width = value
    if ratio == 0:
        return "none"
    return f"swiglu(intermediate_size = {width})" if width is not None else f"swiglu(ratio = {ratio!r})"


MODEL_KEYS: tuple[Key, ...] = (
    Key(
        "model", "vocab", Integer(1, 1 << 24), REQUIRED, "vocab = 256",
        doc="1 .. 2^24 (each required key may come from `from` instead)",
    ),
    Key(
        "model", "d_model", Integer(1, 1 << 20), REQUIRED, "d_model = 128",
        doc="1 .. 2^20",
    ),
    Key(
        "model", "layers", Structured(), REQUIRED, "layers = [gla] * 4",
        doc="1 .. 4096 layers; kinds `gla`, `simple_gla`, `gdn`, `mamba2`, `mamba3`, `attn`, `mlp`",
        value_doc="list of layer kinds",
    ),
    Key(
        "model", "heads", Integer(1, 4096), REQUIRED, "heads = 2",
        doc="1 .. 4096",
    ),
    Key(
        "model", "head_dim", Integer(1, MAX_HEAD_DIM), REQUIRED, "head_dim = 64",
        doc="1 .. 1024",
        value_doc="integer",
    ),
    Key(
        "model", "mlp", Structured(), (ModelConfig.mlp_ratio, None), "mlp = swiglu(ratio = 4)",
        doc=(
            "`ratio > 0` (hidden size `ratio * d_model`, rounded up to a multiple of 8 for aligned bf16 matrices); "
            "`intermediate_size` is the hidden size as is"
        ),
        value_doc="`swiglu(ratio = r)`, `swiglu(intermediate_size = n)` or `none`",
        default_doc="`swiglu(ratio = 4)`",
        fills=("mlp_ratio", "options.mlp_width"),
        write=_mlp_text,
    ),
    Key(
        "model", "stages", Structured(), EVEN_SPLIT, "stages = [[0, 1], [2, 3]]",
        doc="see below",
        value_doc="list of layer-index lists",
        default_doc="equal split",
        fills=(),
    ),
    Key(
        "model", "from", Structured(), None, 'from = hf("examples/hf/gla_tiny")',
        doc=(
            "a Hugging Face directory of flash-linear-attention's GLA or Gated DeltaNet (`config.json`, weights from "
            "`*.safetensors`); it gives every model key the schedule leaves out (docs/models.md)"
        ),
        value_doc="`hf(\"dir\")`",
        fills=(),
    ),
    Key(
        "model", "norm_eps", Number(0.0, above=True), ModelConfig, "norm_eps = 1e-5",
        doc="`> 0`; every RMSNorm's epsilon",
        default_doc="`1e-6`",
    ),
    Key(
        "model", "expand_k", Number(0.0, above=True), HEAD_WIDTH, "expand_k = 0.5",
        doc="`gla` and `gdn` layers: the query/key width over `d_model`; `d_model * expand_k` a multiple of `heads`",
        default_doc="`heads * head_dim / d_model`",
        fills=(),
    ),
    Key(
        "model", "expand_v", Number(0.0, above=True), HEAD_WIDTH, "expand_v = 1",
        doc="must be `heads * head_dim / d_model` (`head_dim` is the value width per head)",
        default_doc="`heads * head_dim / d_model`",
        fills=(),
    ),
    Key(
        "model", "kv_heads", Integer(1, 4096), Derived("heads"), "kv_heads = 1",
        doc="`gla` layers: key/value/gate heads, dividing `heads`",
        default_doc="`heads`",
        fills=("options.gla.kv_heads",),
    ),
    Key(
        "model", "gate_low_rank_dim", Integer(1, 1 << 20), ModelConfig, "gate_low_rank_dim = 16",
        doc="`gla` layers: forget-gate projection `d_model -> r -> key width`; `none`: one full-rank projection",
        fills=("options.gla.gate_rank",),
        accepts_none=True,
    ),
    Key(
        "model", "gate_logit_normalizer", Number(0.0, above=True), ModelConfig, "gate_logit_normalizer = 8",
        doc="`> 0`; the log forget gate is `logsigmoid(x) / gate_logit_normalizer`",
        default_doc="`16`",
        fills=("options.gla.gate_logit_normalizer",),
    ),
    Key(
        "model", "clamp_min", Number(), ModelConfig, "clamp_min = -5",
        doc="`gla` layers: the log forget gate is raised to at least this",
        fills=("options.gla.gate_clamp_min",),
        accepts_none=True,
    ),
    Key(
        "model", "output_gate", Choice(OutputGate, "output gate"), ModelConfig, "output_gate = swish",
        doc="`gla` layers: `swish` RMS-normalises each head's output and multiplies it by `silu(g_proj(x))`",
        fills=("options.gla.output_gate",),
    ),
    Key(
        "model", "delta_gates", Choice(DeltaGates, "delta gates"), ModelConfig, "delta_gates = mamba",
        doc=(
            "`gdn` layers: `log_sigmoid` gates `logsigmoid(W x + b) / 16` and `sigmoid(W x + b)`; `mamba` the forget "
            "gate `-exp(A_log) * softplus(W x + dt_bias)` and the write strength `sigmoid(W x)`, fla's"
        ),
        fills=("options.gdn.gates",),
    ),
    Key(
        "model", "short_conv_size", Integer(1, MAX_SHORT_CONV_SIZE), ModelConfig, "short_conv_size = 4",
        doc=(
            "`gdn` layers: 1 .. 64 taps of a causal depthwise convolution, then SiLU, on q, k and v (fla's "
            "`conv_size`); its last inputs join the layer's state; with `mesh.sequence > 1`, `kernel_chunk >= "
            "short_conv_size - 1`"
        ),
        value_doc="integer or `none`",
        fills=("options.gdn.short_conv_size",),
        accepts_none=True,
    ),
    Key(
        "model", "value_heads", Integer(1, 4096), Derived("heads"), "value_heads = 4",
        doc=(
            "`gdn` layers: value heads, a positive multiple of `heads` (grouped value attention, fla's `num_v_heads`): "
            "v, the gates, the write strength, the output gate and norm and the state have `value_heads` heads, q and "
            "k `heads`; value head `j` reads q/k head `j // (value_heads / heads)`"
        ),
        default_doc="`heads`",
        fills=(),
    ),
    Key(
        "model", "state_size", Integer(1, MAX_HEAD_DIM), ModelConfig, "state_size = 64",
        doc=(
            "`mamba2` and `mamba3` layers: N, the rows of each head's SSD state `[state_size, head_dim]` and the "
            "width of B and C "
            "per group, 1 .. 1024 (fla's `state_size`)"
        ),
        fills=("options.mamba2.state_size",),
    ),
    Key(
        "model", "n_groups", Integer(1, 4096), ModelConfig, "n_groups = 2",
        doc=(
            "`mamba2` and `mamba3` layers: groups of B and C, dividing `heads`; group `g` serves the "
            "`heads / n_groups` consecutive heads from `g heads / n_groups`; mamba2's gated RMSNorm normalises "
            "each group's channels (fla's `n_groups`)"
        ),
        fills=("options.mamba2.n_groups",),
    ),
    Key(
        "model", "conv_kernel", Integer(1, MAX_SHORT_CONV_SIZE), ModelConfig, "conv_kernel = 4",
        doc=(
            "`mamba2` layers: 1 .. 64 taps of the causal depthwise convolution, then SiLU, over x, B and C (fla's "
            "`conv_kernel`); its last inputs join the layer's state; with `mesh.sequence > 1`, `kernel_chunk >= "
            "conv_kernel - 1`"
        ),
        fills=("options.mamba2.conv_kernel",),
    ),
    Key(
        "model", "use_conv_bias", Boolean(), ModelConfig, "use_conv_bias = false",
        doc="`mamba2` layers: the convolution has a bias (zero at initialisation)",
        fills=("options.mamba2.use_conv_bias",),
    ),
    Key(
        "model", "use_bias", Boolean(), ModelConfig, "use_bias = true",
        doc="`mamba2` and `mamba3` layers: `in_proj` and `out_proj` have biases (zero at initialisation)",
        fills=("options.mamba2.use_bias",),
    ),
    Key(
        "model", "dt_min", Number(0.0, above=True), ModelConfig, "dt_min = 0.001",
        doc=(
            "`mamba2` and `mamba3` layers: `> 0`; `dt_bias` starts as the inverse softplus of "
            "`exp(U(log dt_min, log dt_max))`; "
            "`dt_min <= dt_max`"
        ),
        fills=("options.mamba2.dt_min",),
    ),
    Key(
        "model", "dt_max", Number(0.0, above=True), ModelConfig, "dt_max = 0.1",
        doc="`mamba2` and `mamba3` layers: `> 0`, the top of that range",
        fills=("options.mamba2.dt_max",),
    ),
    Key(
        "model", "dt_init_floor", Number(0.0, above=True), ModelConfig, "dt_init_floor = 1e-4",
        doc="`mamba2` and `mamba3` layers: `> 0`; those initial time steps are raised to at least this",
        fills=("options.mamba2.dt_init_floor",),
    ),
    Key(
        "model", "dt_limit", Structured(), ModelConfig, "dt_limit = [0.0, 100.0]",
        doc=(
            "`mamba2` layers: `dt = softplus(dt_proj + dt_bias)` is clamped to `[low, high]`, `0 <= low < high`; "
            "`none`: fla's `(0, inf)`, no clamp"
        ),
        value_doc="`[low, high]` or `none`",
        fills=("options.mamba2.dt_limit",),
        accepts_none=True,
    ),
    Key(
        "model", "rope_fraction", Number(0.0, above=True), ModelConfig, "rope_fraction = 1.0",
        doc=(
            "`mamba3` layers: 0.5 or 1.0, the share of each head's `state_size` state rows the data-dependent "
            "rotary angles turn (fla's `rope_fraction`; `state_size * rope_fraction` rounded down to even, one "
            "angle a row pair)"
        ),
        fills=("options.mamba3.rope_fraction",),
    ),
    Key(
        "model", "A_floor", Number(0.0, above=True), ModelConfig, "A_floor = 1e-4",
        doc="`mamba3` layers: `> 0`; `A = -softplus(dd_A)` is at most `-A_floor` (fla's `A_floor`)",
        fills=("options.mamba3.A_floor",),
    ),
    Key(
        "model", "is_outproj_norm", Boolean(), ModelConfig, "is_outproj_norm = true",
        doc=(
            "`mamba3` layers: the output is RMS-normalised per head, then gated by `silu(z)` (fla's "
            "`RMSNormGated`, norm before gate) before `out_proj`; `false`: only gated"
        ),
        fills=("options.mamba3.is_outproj_norm",),
    ),
    Key(
        "model", "is_mimo", Boolean(), ModelConfig, "is_mimo = false",
        doc="`mamba3` layers: the multi-input multi-output variant; not built, so only `false`",
        fills=("options.mamba3.is_mimo",),
    ),
    Key(
        "model", "mimo_rank", Integer(1, 4096), ModelConfig, "mimo_rank = 4",
        doc="`mamba3` layers: the MIMO rank; unused while `is_mimo = false` (kept so an fla config round-trips)",
        fills=("options.mamba3.mimo_rank",),
    ),
    Key(
        "model", "attn_heads", Integer(1, 4096), Derived("heads"), "attn_heads = 4",
        doc="`attn` layers: query heads, 1 .. 4096",
        default_doc="`heads`",
        fills=("options.attention.heads",),
    ),
    Key(
        "model", "attn_head_dim", Integer(1, MAX_HEAD_DIM), Derived("head_dim"), "attn_head_dim = 64",
        doc="`attn` layers: the width of each query, key and value head, 1 .. 1024",
        value_doc="integer",
        default_doc="`head_dim`",
        fills=("options.attention.head_dim",),
    ),
    Key(
        "model", "attn_kv_heads", Integer(1, 4096), Derived("attn_heads"), "attn_kv_heads = 1",
        doc=(
            "`attn` layers: key/value heads, dividing `attn_heads` (grouped-query attention: each serves `attn_heads / "
            "attn_kv_heads` consecutive query heads)"
        ),
        default_doc="`attn_heads`",
        fills=("options.attention.kv_heads",),
    ),
    Key(
        "model", "qkv_bias", Boolean(), ModelConfig, "qkv_bias = true",
        doc="`attn` layers: the q, k and v projections have biases (zero at initialisation)",
        fills=("options.attention.qkv_bias",),
    ),
    Key(
        "model", "rope_theta", Number(0.0, above=True), ModelConfig, "rope_theta = 10000",
        doc=(
            "`attn` layers: `> 0`; rotary position embeddings of this base (fla's and Llama's 10000) rotate queries "
            "and keys at each token's absolute position in the sequence, half against half (non-interleaved); needs an "
            "even head width; `none`: no position embedding"
        ),
        fills=("options.attention.rope_theta",),
        accepts_none=True,
    ),
    Key(
        "model", "tie_embeddings", Boolean(), ModelConfig, "tie_embeddings = true",
        doc=(
            "the LM head uses the embedding's weight, on any mesh: as in Megatron-LM, a last stage after the first "
            "holds a copy, initialised equal (the same seed piece or the same loaded tensor), and after each backward "
            "the two gradients are summed over the first and last stage's ranks, so the copies stay identical; the "
            "gradient clip counts the weight once, checkpoints hold it once (under the embedding's name, so they load "
            "into any pipeline size and `export-model` writes fla's `tie_word_embeddings = true`), and the memory "
            "model counts the copy on the last stage"
        ),
        fills=("options.tie_embeddings",),
    ),
)
