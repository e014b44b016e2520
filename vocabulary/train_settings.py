"""The records a schedule's ``train`` block fills: optimizer, data, learning-rate schedule, loss scale, run.

One record family serves every stage: the checker builds them from the ``train`` keys, the program holds
them (``ScheduleProgram.train``), codegen writes the fields that differ from their defaults into the training
script, and the runtime's trainer reads them. :data:`TRAIN_KEYS`, after the records, is the key schema's rows
of the ``train`` block (``schedlang.vocabulary.keys``): a key that sets one field of :class:`TrainConfig` is
that field and its row, both here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from schedlang.vocabulary.keys import Boolean, Choice, Derived, Integer, Key, Number, Structured
from schedlang.vocabulary.kinds import DataKind, DType, LearningRateScheduleKind, OptimizerKind, TokenFileDType


@dataclass(frozen=True)
class OptimizerConfig:
    kind: OptimizerKind = OptimizerKind.ADAMW
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OptimizerKind(self.kind))


@dataclass(frozen=True)
class DataConfig:
    kind: DataKind = DataKind.SYNTHETIC
    seed: int = 0
    path: str | None = None  # DataKind.BYTES (None reads the default corpus) and DataKind.TOKENS
    dtype: TokenFileDType = TokenFileDType.UINT16  # DataKind.TOKENS only
    tokenizer: str | None = None  # DataKind.TEXT only: a Hugging Face tokenizer.json
    validation: float = 0.0  # the last fraction of a file's tokens, held out for validation batches
    # the token id that ends each packed document (text data: or the tokenizer's name of it); None: no packing
    document_end: int | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DataKind(self.kind))
        object.__setattr__(self, "dtype", TokenFileDType(self.dtype))


@dataclass(frozen=True)
class LearningRateScheduleConfig:
    """``warmup`` steps rising linearly to the optimizer's lr, then ``kind`` down to ``min_lr`` at the run's
    last step (schedlang.runtime.lr_schedule)."""

    kind: LearningRateScheduleKind = LearningRateScheduleKind.CONSTANT
    warmup: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LearningRateScheduleKind(self.kind))


@dataclass(frozen=True)
class LossScaleConfig:
    """``train.loss_scale``: the loss is multiplied by a scale before the backward and the gradients divided
    by it after; ``dynamic`` changes the scale by torch.amp.GradScaler's rules, else it stays ``initial``
    ([Note: loss scaling] in schedlang.runtime.loss_scale)."""

    dynamic: bool = True
    initial: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 10
    seed: int = 0
    dtype: DType = DType.FP32
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    grad_clip: float | None = None
    decay_norms_and_biases: bool = True  # false: the optimizer's weight decay skips parameters of < 2 dimensions
    checkpoint_directory: str | None = None
    checkpoint_every: int = 0
    log_every: int = 1
    lr_schedule: LearningRateScheduleConfig = field(default_factory=LearningRateScheduleConfig)
    tensorboard_directory: str | None = None  # TensorBoard scalars of every step (schedlang.runtime.progress)
    eval_every: int = 0  # a validation loss after every this many steps; 0: none
    eval_batches: int = 1  # validation batches (each a global batch) per evaluation
    master_weights: bool = True  # fp32 master weights for a 16-bit dtype: see keeps_master_weights
    loss_scale: LossScaleConfig | None = None  # None: no loss scaling (the checker asks for it with fp16)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))

    @property
    def keeps_master_weights(self) -> bool:
        """Whether the optimizer updates fp32 master weights of a 16-bit model ([Note: master weights] in
        schedlang.runtime.master_weights)."""
        return self.master_weights and self.dtype.is_16_bit


MAX_SEED = (1 << 63) - 1
LOSS_SCALE_DEFAULT = Derived("dynamic with dtype = fp16, else none")


def _checkpoint_text(value: tuple[str, int]) -> str:
    directory, every = value
    return f"{json.dumps(directory, ensure_ascii=False)} every {every}"


def _loss_scale_text(value: LossScaleConfig) -> str:
    return "dynamic" if value.dynamic else repr(float(value.initial))


TRAIN_KEYS: tuple[Key, ...] = (
    Key(
        "train", "steps", Integer(1, 1 << 40), TrainConfig, "steps = 20",
        doc=">= 1",
    ),
    Key(
        "train", "optimizer", Structured(), TrainConfig, "optimizer = adamw(lr = 3e-3)",
        doc=(
            "`lr > 0`; `weight_decay >= 0` (default 0); `betas = [b1, b2]`, each in [0, 1) (default [0.9, 0.999]); "
            "`momentum` in [0, 1) (default 0)"
        ),
        value_doc="`adamw(lr, weight_decay, betas)` or `sgd(lr, momentum, weight_decay)`",
        default_doc="`adamw(lr = 1e-3)`",
    ),
    Key(
        "train", "dtype", Choice(DType, "dtype"), TrainConfig, "dtype = bf16",
        doc=(
            "the compute precision: the parameters as the layers read them, the activations, the messages between "
            "stages and sequence ranks, and the recurrent states between chunks (the kernels accumulate in fp32 "
            "inside). With `bf16` or `fp16` the optimizer's parameters, the accumulated gradients and the optimizer's "
            "state are fp32 (`master_weights`)"
        ),
    ),
    Key(
        "train", "master_weights", Boolean(), TrainConfig, "master_weights = false",
        doc=(
            "with a 16-bit `dtype`: the optimizer updates fp32 master copies of the parameters, each chunk's weight "
            "gradients are added into fp32 gradients (so many chunks and microbatches sum in fp32), gradients are "
            "all-reduced, clipped and checkpointed in fp32, and the 16-bit parameters are copied from the master ones "
            "after each step (Megatron-LM's and FSDP's mixed precision; `fp16` scales the loss: `loss_scale`). The "
            "memory model counts the copies (docs/cost-model.md). `false`: parameters, gradients and optimizer state "
            "all in `dtype`. No effect with `fp32` or `fp64`"
        ),
    ),
    Key(
        "train", "loss_scale", Structured(), LOSS_SCALE_DEFAULT, "loss_scale = dynamic",
        doc=(
            "`fp16` only (refused at this key with another `dtype`); a number > 0 is a fixed scale. The last stage's "
            "backward starts from the scale, the gradients are divided by it after their all-reduces and checked for "
            "inf and nan (torch.amp.GradScaler's ops); when any rank finds one, every rank skips that step's clip and "
            "optimizer step, while the learning-rate schedule advances as usual (the learning rate stays a function of "
            "the step number). `dynamic` starts at 2^16, halves after a skipped step and doubles after 2000 clean "
            "steps in a row (GradScaler's rules). The scale is checkpointed and resumed, and shown in the progress "
            "line, the metrics (`loss_scale`, `skipped`) and TensorBoard (`train/loss_scale`). Deciding to skip waits "
            "for every rank at the step's end, as `grad_clip` does"
        ),
        value_doc="`dynamic`, a number, or `none`",
        default_doc="`dynamic` with `dtype = fp16`, else `none`",
        write=_loss_scale_text,
        accepts_none=True,
    ),
    Key(
        "train", "data", Structured(), TrainConfig, "data = synthetic(seed = 0)",
        doc=(
            "`seed >= 0`; `path` and `tokenizer` non-empty strings, relative to the schedule file (`bytes` without a "
            "path: the default corpus; `tokens` and `text` need theirs); a `tokens` file is a flat array of "
            "little-endian ids, no header (nanoGPT's and Megatron's `.bin`), memory-mapped; `dtype` defaults to "
            "`uint16`; `validation = f` (`bytes`, `tokens`, `text`; 0 <= f < 1, default 0) holds the last fraction of "
            "the file's tokens out of training for `eval_every` (synthetic data draws validation batches from a stream "
            "of its own); `text` is tokenised once by the Hugging Face `tokenizers` library (the `text` extra) into a "
            "cached `uint32` tokens file (`$SCHEDLANG_CACHE`, else `~/.cache/schedlang`), again only when the text or "
            "the tokenizer changes. `document_end = id` (`bytes`, `tokens`, `text`; `text` also takes the tokenizer's "
            "name of the token, e.g. `document_end = \"<|endoftext|>\"`; default: none) is the token that ends each "
            "document packed into the file: documents then never see each other (see \"Packed documents\" below). "
            "`check` and `run` refuse, at this key, a file that is missing, not a regular file, empty, shorter than "
            "one sequence, not a whole number of ids, or holds an id `>= vocab`, and at `document_end` an id `>= "
            "vocab` (for `bytes`, above 255) or a name the tokenizer lacks"
        ),
        value_doc=(
            "`synthetic(seed = s)`, `bytes(path = \"file\", seed = s)` `tokens(path = \"file\", dtype = t, seed = s)` "
            "(`t`: `uint16` or `uint32`) or `text(path = \"file\", tokenizer = \"tokenizer.json\", seed = s)`"
        ),
        default_doc="`synthetic(seed = 0)`",
    ),
    Key(
        "train", "seed", Integer(0, MAX_SEED), TrainConfig, "seed = 1",
        doc="parameter initialisation seed, >= 0",
        value_doc="integer",
    ),
    Key(
        "train", "grad_clip", Number(0.0, above=True), TrainConfig, "grad_clip = 1.0",
        doc="> 0 (global gradient-norm clip)",
        accepts_none=True,
    ),
    Key(
        "train", "decay_norms_and_biases", Boolean(), TrainConfig, "decay_norms_and_biases = false",
        doc=(
            "`false`: the optimizer's `weight_decay` applies only to parameters of two or more dimensions (the "
            "linear layers' weights, the embedding, the convolutions), not to norm weights, biases or Mamba "
            "gates' `A_log` and `dt_bias` (nanoGPT's and Megatron-LM's grouping); `true` decays every parameter. "
            "No effect with `weight_decay = 0`"
        ),
    ),
    Key(
        "train", "log_every", Integer(1, 1 << 40), TrainConfig, "log_every = 5",
        doc=">= 1",
    ),
    Key(
        "train", "lr_schedule", Structured(), TrainConfig, "lr_schedule = cosine(warmup = 100, min_lr = 3e-5)",
        doc=(
            "the first `warmup` steps (default 0) rise linearly to the optimizer's `lr`; `cosine` and `linear` then "
            "fall to `min_lr` (default 0, at most `lr`) at the last of `train.steps` (torch's `LambdaLR`); `warmup < "
            "steps`; a resumed run continues the same rates"
        ),
        value_doc="`constant`, `cosine(warmup = N, min_lr = x)` or `linear(warmup = N, min_lr = x)`",
        default_doc="`constant`",
    ),
    Key(
        "train", "log", Structured(), TrainConfig, 'log = tensorboard(directory = "runs/x")',
        doc=(
            "rank 0 writes each step's loss, tokens/s, step time and peak memory as TensorBoard scalars there "
            "(relative to the schedule file), besides `--metrics`; needs the `tensorboard` package (the `tensorboard` "
            "extra), which `check` and `run` ask for"
        ),
        value_doc="`tensorboard(directory = \"dir\")` or `none`",
        fills=("tensorboard_directory",),
        accepts_none=True,
    ),
    Key(
        "train", "eval_every", Integer(0, 1 << 40), TrainConfig, "eval_every = 100",
        doc=(
            ">= 0; after every this many steps, the mean loss of `eval_batches` validation batches, forward only "
            "(progress line `val`, `--metrics` `validation_loss`, TensorBoard `validation/loss`); 0: never. File data "
            "needs `validation > 0`"
        ),
    ),
    Key(
        "train", "eval_batches", Integer(1, 1 << 20), TrainConfig, "eval_batches = 4",
        doc=">= 1; each a global batch",
    ),
    Key(
        "train", "checkpoint", Structured(), TrainConfig, 'checkpoint = "runs/ckpt" every 50',
        doc="non-empty directory, N >= 1",
        value_doc="`\"dir\" every N` or `none`",
        fills=("checkpoint_directory", "checkpoint_every"),
        write=_checkpoint_text,
        accepts_none=True,
        accepts_every=True,
    ),
)
