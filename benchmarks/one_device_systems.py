"""The systems of benchmarks/one_device.py, each the whole model on one device with ``step()``,
``model_state_bytes()`` and ``close()``: plain torch on the runtime's modules (with or without activation
checkpointing), flash-linear-attention's GLAForCausalLM, and schedlang's Trainer on a one-device mesh."""

from __future__ import annotations

import socket

import torch

from benchmarks.common import model_state_bytes, single_rank_environment
from benchmarks.installed import import_installed
from benchmarks.pipeline_schedule import (
    ONE_DEVICE_SCHEDULE,
    TORCH_CHECKPOINTED_SYSTEM,
    TORCH_SYSTEMS,
    BenchmarkSchedule,
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


def one_device_schedule(tiny: bool) -> BenchmarkSchedule:
    """The one-device benchmark's schedule file (with ``tiny``, its model revised to the tiny one)."""
    return BenchmarkSchedule(ONE_DEVICE_SCHEDULE, tiny=tiny)


def configs_of(name: str, schedule: BenchmarkSchedule, length: int, dtype: str) -> RuntimeConfigs:
    """The compiled configs of a system; ``fla`` and the torch peers take the model from the file as it is."""
    return system_configs(schedule, name, length, 1, dtype)


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
    """flash-linear-attention's GLAForCausalLM with the widths of the schedule's model
    (``schedlang.runtime.hf_format.fla_peer_config`` says what differs), schedlang's AdamW and tokens."""

    def __init__(self, configs: RuntimeConfigs, device: torch.device, length: int) -> None:
        import_installed("fla")  # benchmarks/installed.py: the checkout's own `kernels` off sys.path
        from fla.models import GLAConfig, GLAForCausalLM
        from schedlang.runtime.data import TokenSource
        from schedlang.runtime.hf_format import fla_peer_config
        from schedlang.runtime.trainer import DTYPES, build_optimizer, zero_gradients

        config = GLAConfig(**fla_peer_config(configs.model, DTYPES[configs.train.dtype]))
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


def build_system(name: str, schedule: BenchmarkSchedule, length: int, device: torch.device):
    configs = configs_of(name, schedule, length, train_dtype(device.type))
    if name == FLA_SYSTEM:
        return FlaSystem(configs, device, length)
    if name in TORCH_SYSTEMS:
        return WholeModelTorchSystem(configs, device, length, checkpointed=name == TORCH_CHECKPOINTED_SYSTEM)
    from schedlang.runtime.trainer import launch

    single_rank_environment(free_port())  # a process group of one rank: the runtime's mesh needs one
    return SchedlangSystem(launch(configs.model, configs.pipeline, configs.train, (1, 1, 1), device.type, 600.0))
