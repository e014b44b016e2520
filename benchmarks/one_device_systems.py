"""The systems of benchmarks/one_device.py, each the whole model on one device with ``step()``,
``model_state_bytes()`` and ``close()``: plain torch on the runtime's modules (with or without activation
checkpointing), flash-linear-attention's GLAForCausalLM, and schedlang's Trainer on a one-device mesh."""

from __future__ import annotations

import socket
from dataclasses import replace

import torch

from benchmarks.common import model_state_bytes, single_rank_environment
from benchmarks.pipeline_schedule import (
    FULL_MODEL,
    TINY_MODEL,
    TORCH_CHECKPOINTED_SYSTEM,
    TORCH_SYSTEMS,
    BenchmarkModel,
    RuntimeConfigs,
    system_configs,
)
from benchmarks.training_systems import (
    FullSequenceStage,
    SchedlangSystem,
    full_sequence_loss,
    train_dtype,
)

FLA_SYSTEM = "fla"
"""flash-linear-attention's GLAForCausalLM."""
MAMBA2_PREFIX = "mamba2:"
"""``mamba2:<variant>``: schedlang's ``schedlang:<variant>`` on the same model with mamba2 mixing layers."""


def system_and_model(name: str, model: BenchmarkModel) -> tuple[str, BenchmarkModel]:
    """The schedlang or peer system a name runs and the model it runs on: ``mamba2:16/full`` is ``schedlang:16/full``
    on ``model`` with every mixing layer ``mamba2`` (the model's heads and head width, Mamba2Options' defaults:
    state size 128, one group, 4 taps); any other name runs ``model`` as it is."""
    if name.startswith(MAMBA2_PREFIX):
        return "schedlang:" + name.removeprefix(MAMBA2_PREFIX), replace(model, mixer="mamba2")
    return name, model


def one_device_model(tiny: bool) -> BenchmarkModel:
    """The pipeline benchmark's model (or its tiny one) on one pipeline stage."""
    return replace(TINY_MODEL if tiny else FULL_MODEL, pipeline_stages=1)


def configs_of(name: str, model: BenchmarkModel, length: int, dtype: str) -> RuntimeConfigs:
    """The compiled configs of a system; ``fla`` and the torch peers take the model from the one-chunk schedule."""
    name, model = system_and_model(name, model)
    return system_configs(TORCH_SYSTEMS[0] if name == FLA_SYSTEM else name, model, length, 1, dtype)


def fla_config_keys(model_config) -> dict:
    """``GLAConfig`` keys for fla's GLA with the widths of schedlang's model ``model_config`` (a runtime
    ModelConfig of ``gla`` layers with default GLA options).

    Equal: hidden size, layers, heads, query/key and value widths (``expand_k`` and ``expand_v`` are
    ``heads * head_dim / d_model``), SwiGLU width (``intermediate_size``, schedlang's rounding), vocabulary,
    untied embeddings, no short convolution, no output gate, RMSNorm epsilon. Different, as fla builds its
    GLA layer: the forget gate is a low-rank projection (fla's ``gate_low_rank_dim``, 16) where schedlang's is
    full rank; the mixer's output passes a per-head RMSNorm that schedlang's default GLA does not have; the
    loss is fla's fused cross entropy over bf16 logits; fla initialises its own weights.
    """
    from schedlang.runtime.model import swiglu_width

    width = model_config.heads * model_config.head_dim
    return {
        "hidden_size": model_config.d_model,
        "num_hidden_layers": len(model_config.layers),
        "num_heads": model_config.heads,
        "expand_k": width / model_config.d_model,
        "expand_v": width / model_config.d_model,
        "intermediate_size": swiglu_width(model_config.d_model, model_config.mlp_ratio),
        "hidden_act": "swish",
        "vocab_size": model_config.vocab,
        "tie_word_embeddings": False,
        "use_short_conv": False,
        "use_output_gate": False,
        "norm_eps": model_config.norm_eps,
        "attn_mode": "chunk",
        "use_cache": False,
        "fuse_cross_entropy": True,
    }


class WholeModelTorchSystem:
    """The runtime's modules as one stage, trained on the full sequence by plain torch (``checkpointed``: with
    torch's activation checkpointing on every block)."""

    def __init__(self, configs: RuntimeConfigs, device: torch.device, length: int, checkpointed: bool) -> None:
        from schedlang.runtime.data import TokenSource
        from schedlang.runtime.model import Block, build_stage_model
        from schedlang.runtime.trainer import DTYPES, build_optimizer, zero_gradients
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
        )

        (layers,) = configs.pipeline.stage_layers
        model = build_stage_model(configs.model, layers, True, True, 0, device, DTYPES[configs.train.dtype])
        if checkpointed:
            apply_activation_checkpointing(model, check_fn=lambda module: isinstance(module, Block))
        self.module = FullSequenceStage(model)
        self.optimizer = build_optimizer(self.module.parameters(), configs.train)  # schedlang's AdamW
        self.zero_gradients = zero_gradients
        self.tokens = TokenSource(configs.train.data, configs.model.vocab, length, 1)
        self.device = device
        self.step_index = 0

    def model_state_bytes(self) -> int:
        return model_state_bytes(self.module, self.optimizer)

    def step(self) -> None:
        tokens = self.tokens.global_batch_tokens(self.step_index).to(self.device)
        self.zero_gradients(self.optimizer)
        full_sequence_loss(self.module(tokens[:, :-1]), tokens[:, 1:]).backward()
        self.optimizer.step()
        self.step_index += 1

    def close(self) -> None:
        self.module = self.optimizer = None


class FlaSystem:
    """flash-linear-attention's GLAForCausalLM (:func:`fla_config_keys`), schedlang's AdamW and tokens."""

    def __init__(self, configs: RuntimeConfigs, device: torch.device, length: int) -> None:
        from fla.models import GLAConfig, GLAForCausalLM
        from schedlang.runtime.data import TokenSource
        from schedlang.runtime.trainer import DTYPES, build_optimizer, zero_gradients

        config = GLAConfig(**fla_config_keys(configs.model))
        with torch.device(device):  # initialised where it trains: a 1B model's init on the host takes long
            self.model = GLAForCausalLM(config).to(dtype=DTYPES[configs.train.dtype])
        self.model.train()
        self.optimizer = build_optimizer(self.model.parameters(), configs.train)
        self.zero_gradients = zero_gradients
        self.tokens = TokenSource(configs.train.data, configs.model.vocab, length, 1)
        self.device = device
        self.step_index = 0

    def model_state_bytes(self) -> int:
        return model_state_bytes(self.model, self.optimizer)

    def step(self) -> None:
        # fla shifts the labels itself: position t is trained to predict token t + 1
        inputs = self.tokens.global_batch_tokens(self.step_index)[:, :-1].to(self.device)
        self.zero_gradients(self.optimizer)
        self.model(input_ids=inputs, labels=inputs).loss.backward()
        self.optimizer.step()
        self.step_index += 1

    def close(self) -> None:
        self.model = self.optimizer = None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def build_system(name: str, model: BenchmarkModel, length: int, device: torch.device):
    configs = configs_of(name, model, length, train_dtype(device.type))
    if name == FLA_SYSTEM:
        return FlaSystem(configs, device, length)
    if name in TORCH_SYSTEMS:
        return WholeModelTorchSystem(configs, device, length, checkpointed=name == TORCH_CHECKPOINTED_SYSTEM)
    from schedlang.runtime.trainer import launch

    single_rank_environment(free_port())  # a process group of one rank: the runtime's mesh needs one
    return SchedlangSystem(launch(configs.model, configs.pipeline, configs.train, (1, 1, 1), device.type, 600.0))
