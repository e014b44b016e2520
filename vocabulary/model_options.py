"""The architecture choices of a model beyond its sizes, with today's schedlang model as every default.

flash-linear-attention's ``GLAForCausalLM`` and ``GatedDeltaNetForCausalLM`` are points of this space
(``docs/models.md`` maps their config fields to these): a narrower key width (``expand_k``), fewer
key/value heads than query heads, a low-rank forget-gate projection, a swish output gate behind a per-head
RMSNorm, Mamba2's forget gate and short convolutions in Gated DeltaNet layers, the MLP's hidden width
given exactly, an LM head tied to the embedding, and softmax-attention layers with their own head layout,
grouped key/value heads, q/k/v biases and rotary position embeddings. A generated training script writes a
:class:`ModelOptions` only when one of them differs from its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum

from schedlang.vocabulary.kinds import DeltaGates, OutputGate


GATE_LOGIT_NORMALIZER = 16.0
"""GLA divides the log-sigmoid gate by 16 so forget gates start close to 1 (GLA paper, section 4)."""


@dataclass(frozen=True)
class GlaOptions:
    """The options of ``gla`` layers (``simple_gla``, ``gdn`` and ``attn`` layers ignore them).

    ``head_k_dim``: the per-head width of queries and keys (None: ``head_dim``, the value width).
    ``kv_heads``: heads of the key, value and forget-gate projections, each shared by
    ``heads / kv_heads`` query heads (None: ``heads``).
    ``gate_rank``: the forget-gate projection is ``d_model -> gate_rank`` (no bias) then
    ``gate_rank -> key width`` (with bias); None: one full-rank projection with bias.
    ``gate_logit_normalizer``: the log forget gate is ``logsigmoid(logits) / gate_logit_normalizer``,
    then raised to at least ``gate_clamp_min`` when that is not None.
    """

    head_k_dim: int | None = None
    kv_heads: int | None = None
    gate_rank: int | None = None
    gate_logit_normalizer: float = GATE_LOGIT_NORMALIZER
    gate_clamp_min: float | None = None
    output_gate: OutputGate = OutputGate.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_gate", OutputGate(self.output_gate))


@dataclass(frozen=True)
class GdnOptions:
    """The options of ``gdn`` layers (the other layer kinds ignore them).

    ``head_k_dim``: the per-head width of queries and keys (None: ``head_dim``, the value width).
    ``gates``: :class:`DeltaGates`. ``short_conv_size``: q, k and v each pass through a causal depthwise
    convolution of this many taps without bias, then SiLU (flash-linear-attention's ``ShortConvolution``);
    its last ``short_conv_size - 1`` inputs are part of the layer's state
    (``schedlang.runtime.short_convolution``). None: no convolution and no activation.
    ``value_heads``: grouped value attention, flash-linear-attention's ``num_v_heads``: the value projection,
    the gates, the write strength, the output gate and norm and the state have ``value_heads`` heads (a
    positive multiple of the model's ``heads``, which size q and k), and value head ``j`` reads q/k head
    ``j // (value_heads // heads)`` (:meth:`value_heads_of`; None: ``heads``).
    """

    head_k_dim: int | None = None
    gates: DeltaGates = DeltaGates.LOG_SIGMOID
    short_conv_size: int | None = None
    value_heads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gates", DeltaGates(self.gates))

    def value_heads_of(self, heads: int) -> int:
        """The value heads of a ``gdn`` layer of a model with ``heads`` q/k heads: the heads of its state
        ``[value_heads, head_k_dim, head_dim]``, of its values and of every per-head gate and norm."""
        return self.value_heads or heads


@dataclass(frozen=True)
class Mamba2Options:
    """The options of ``mamba2`` layers (the other layer kinds ignore them), in flash-linear-attention's
    ``Mamba2Config`` names; the layer's heads and head width are the model's ``heads`` and ``head_dim``
    (fla's ``num_heads = expand * hidden_size / head_dim``).

    ``state_size``: N, the state's rows per head (the state is ``[heads, state_size, head_dim]``).
    ``n_groups``: B and C have ``n_groups`` groups of ``state_size``, each shared by ``heads / n_groups``
    consecutive heads; the gated RMSNorm normalises each group's ``heads * head_dim / n_groups`` channels.
    ``conv_kernel``: taps of the causal depthwise convolution (then SiLU) over x, B and C, whose last
    ``conv_kernel - 1`` inputs join the state; ``use_conv_bias``: the convolution has a bias.
    ``use_bias``: the input and output projections have biases.
    ``dt_min``, ``dt_max``, ``dt_init_floor``: ``dt_bias`` starts as the inverse softplus of
    ``exp(U(log dt_min, log dt_max))`` raised to at least ``dt_init_floor``.
    ``dt_limit``: ``dt = softplus(dt_proj + dt_bias)`` is clamped to ``[low, high]`` (``high`` None: no upper
    bound); None: fla's ``(0, inf)``, no clamp.
    """

    state_size: int = 128
    n_groups: int = 1
    conv_kernel: int = 4
    use_conv_bias: bool = True
    use_bias: bool = False
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    dt_limit: tuple[float, float | None] | None = None

    def __post_init__(self) -> None:
        if self.dt_limit is not None:
            object.__setattr__(self, "dt_limit", tuple(self.dt_limit))

    def inner_width(self, heads: int, head_dim: int) -> int:
        """fla's ``intermediate_size``: the width of x, of the gate z and of the output projection's input."""
        return heads * head_dim

    def convolved_width(self, heads: int, head_dim: int) -> int:
        """fla's ``conv_dim``: the channels of x, B and C, which the convolution mixes and its history keeps."""
        return self.inner_width(heads, head_dim) + 2 * self.n_groups * self.state_size


@dataclass(frozen=True)
class Mamba3Options:
    """The options of ``mamba3`` layers (Mamba-3 SISO; the other layer kinds ignore them), in
    flash-linear-attention's ``Mamba3Config`` names; heads and head width are the model's ``heads`` and
    ``head_dim``. The schedule's ``state_size``, ``n_groups``, ``use_bias``, ``dt_min``, ``dt_max`` and
    ``dt_init_floor`` keys fill these as they fill :class:`Mamba2Options`'.

    ``state_size``: N, the state's rows per head (the state is ``[heads, state_size, head_dim]``).
    ``n_groups``: B and C have ``n_groups`` groups of ``state_size``, each shared by ``heads / n_groups``
    consecutive heads (each head adds its own B/C bias). ``use_bias``: the projections have biases.
    ``dt_min``, ``dt_max``, ``dt_init_floor``: ``dt_bias``'s initial time steps, as for Mamba-2.
    ``rope_fraction``: 0.5 or 1.0, the share of the state rows the data-dependent rotary angles turn
    (:meth:`angle_count` angles, each turning one row pair). ``A_floor``: ``A = -softplus(dd_A)`` is at most
    ``-A_floor``. ``is_outproj_norm``: the output is normalised per head after gating with ``silu(z)``
    (fla's ``RMSNormGated``, norm before gate) instead of only gated. ``is_mimo`` and ``mimo_rank``: the
    multi-input multi-output variant, which is not built (``is_mimo`` must be False; ``mimo_rank`` is kept
    only so an fla config round-trips).
    """

    state_size: int = 128
    n_groups: int = 1
    use_bias: bool = False
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    rope_fraction: float = 0.5
    A_floor: float = 1e-4
    is_outproj_norm: bool = False
    is_mimo: bool = False
    mimo_rank: int = 4

    def inner_width(self, heads: int, head_dim: int) -> int:
        """fla's ``intermediate_size``: the width of x, of the gate z and of the output projection's input."""
        return heads * head_dim

    def angle_count(self) -> int:
        """fla's ``num_rope_angles``: ``state_size * rope_fraction`` rounded down to even, halved."""
        turned = int(self.state_size * self.rope_fraction)
        return (turned - turned % 2) // 2

    def projected_width(self, heads: int, head_dim: int) -> int:
        """fla's ``d_in_proj``: z and x, B and C, dt, A and trap per head, and the angles."""
        return 2 * heads * head_dim + 2 * self.n_groups * self.state_size + 3 * heads + self.angle_count()


@dataclass(frozen=True)
class AttentionOptions:
    """The options of ``attn`` layers (the other layer kinds ignore them).

    ``heads`` and ``head_dim``: the query heads and their width (None: the model's ``heads`` and
    ``head_dim``). ``kv_heads``: heads of the key and value projections, each shared by
    ``heads / kv_heads`` consecutive query heads (None: ``heads``). ``qkv_bias``: the q, k and v projections
    have biases (zero at initialisation). ``rope_theta``: queries and keys are rotated by rotary position
    embeddings of this base at each token's position in the sequence (``schedlang.runtime.rotary``); None:
    no position embedding.
    """

    heads: int | None = None
    head_dim: int | None = None
    kv_heads: int | None = None
    qkv_bias: bool = False
    rope_theta: float | None = None


@dataclass(frozen=True)
class ModelOptions:
    """Everything of :class:`GlaOptions`, :class:`GdnOptions`, :class:`Mamba2Options`, :class:`Mamba3Options` and
    :class:`AttentionOptions`,
    plus what every
    model has.

    ``mlp_width``: the SwiGLU hidden width as is (None: ``d_model * mlp_ratio`` rounded up to a multiple
    of 8). ``tie_embeddings``: the LM head's weight is the embedding's (one stage only).
    ``initial_weights``: a Hugging Face model directory whose ``*.safetensors`` hold the weights training
    starts from, in flash-linear-attention's names (``schedlang.runtime.hf_weights``); None: the seed's.
    """

    gla: GlaOptions = field(default_factory=GlaOptions)
    gdn: GdnOptions = field(default_factory=GdnOptions)
    attention: AttentionOptions = field(default_factory=AttentionOptions)
    mamba2: Mamba2Options = field(default_factory=Mamba2Options)
    mamba3: Mamba3Options = field(default_factory=Mamba3Options)
    mlp_width: int | None = None
    tie_embeddings: bool = False
    initial_weights: str | None = None

    def architecture_record(self) -> tuple[tuple[str, object], ...]:
        """``(name, value)`` of every option that shapes the network (not where its weights come from),
        as plain literals, for a checkpoint's run record and ``schedlang export-model``; the ``gdn`` and
        ``attention`` options only when one differs from its default, so records written before they existed
        still match."""
        entries: list[tuple[str, object]] = []
        recorded = (("gla", self.gla),) + ((("gdn", self.gdn),) if self.gdn != GdnOptions() else ())
        recorded += (("attention", self.attention),) if self.attention != AttentionOptions() else ()
        recorded += (("mamba2", self.mamba2),) if self.mamba2 != Mamba2Options() else ()
        recorded += (("mamba3", self.mamba3),) if self.mamba3 != Mamba3Options() else ()
        for prefix, options in recorded:
            for option in fields(options):
                value = getattr(options, option.name)
                entries.append((f"{prefix}.{option.name}", value.value if isinstance(value, Enum) else value))
        entries.append(("mlp_width", self.mlp_width))
        entries.append(("tie_embeddings", self.tie_embeddings))
        return tuple(entries)

    @classmethod
    def from_architecture_record(cls, entries) -> "ModelOptions":
        """The inverse of :meth:`architecture_record` (``initial_weights`` None); a record written before
        ``gdn`` or ``attention`` options existed has their defaults."""
        values = dict(entries)
        gla = GlaOptions(**{option.name: values[f"gla.{option.name}"] for option in fields(GlaOptions)})

        def recorded(prefix: str) -> dict[str, object]:
            return {name.removeprefix(prefix): value for name, value in values.items() if name.startswith(prefix)}

        return cls(
            gla=gla,
            gdn=GdnOptions(**recorded("gdn.")),
            attention=AttentionOptions(**recorded("attention.")),
            mamba2=Mamba2Options(**recorded("mamba2.")),
            mamba3=Mamba3Options(**recorded("mamba3.")),
            mlp_width=values["mlp_width"],
            tie_embeddings=values["tie_embeddings"],
        )
