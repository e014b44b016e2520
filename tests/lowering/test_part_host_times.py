"""Host times per part (``[[layer]] host_*`` of a hardware profile) and how the profile cost model prices them.

The small profile of test_hardware_profile: every stage of ``program_of`` runs two gla and two mlp blocks, and
the embedding (stage 0) or the head (stage 1). With a host time of milliseconds against microseconds of device
time, every eager task is bound by its host time, so a task's seconds are its parts' host times summed.
"""

from __future__ import annotations

import pytest

from schedlang.lowering.hardware_profile import (
    HardwareProfileError,
    PartHost,
    ProfiledPart,
    format_hardware_profile,
    parse_hardware_profile,
)
from schedlang.lowering.profile_cost import ProfileCostModel
from schedlang.vocabulary.actions import ActionKind, TaskId
from tests.lowering.test_hardware_profile import profile_text, program_of

OVERHEAD_FORWARD = 1e-3  # the [overhead] figures: three times the forward for the whole backward
GLA_HOST = "host_forward = 4e-3\nhost_backward = 9e-3\n"
GLA_OFFLOAD = "host_offload_forward = 6e-3\nhost_offload_backward = 10e-3\n"
GLA_RECOMPUTE = "host_recompute_forward = 5e-3\nhost_recompute_backward = 16e-3\n"


def profile_with(gla_keys: str):
    """The small profile with ``gla_keys`` added to its gla row."""
    text = profile_text(eager_layer_seconds=OVERHEAD_FORWARD)
    anchor = 'kind = "gla"\n'
    assert anchor in text
    return parse_hardware_profile(text.replace(anchor, anchor + gla_keys, 1), "hosted.toml")


def seconds(model: ProfileCostModel, kind: ActionKind, stage: int = 0, microbatch: int = 0, chunk: int = 0) -> float:
    return model.task_duration(TaskId(kind, stage, microbatch, chunk))


def test_a_layer_states_its_host_times_and_they_round_trip():
    profile = profile_with(GLA_HOST + GLA_OFFLOAD)
    assert profile.part_host(ProfiledPart.GLA) == PartHost(4e-3, 9e-3, 6e-3, 10e-3)
    # a part without its own figures reads the [overhead] ones, with no offload cost
    assert profile.part_host(ProfiledPart.MLP) == PartHost(OVERHEAD_FORWARD, 3 * OVERHEAD_FORWARD)
    assert not profile.part_host(ProfiledPart.MLP).offload_measured
    again = parse_hardware_profile(format_hardware_profile(profile))
    assert again.layers == profile.layers
    without_offload = profile_with(GLA_HOST)
    assert parse_hardware_profile(format_hardware_profile(without_offload)).layers == without_offload.layers
    rerun = profile_with(GLA_HOST + GLA_RECOMPUTE)
    assert rerun.part_host(ProfiledPart.GLA) == PartHost(4e-3, 9e-3, 0.0, 0.0, 5e-3, 16e-3)
    assert rerun.part_host(ProfiledPart.GLA).recompute_measured and not rerun.part_host(ProfiledPart.GLA).offload_measured
    assert parse_hardware_profile(format_hardware_profile(rerun)).layers == rerun.layers


def test_an_offload_host_time_without_the_plain_ones_is_a_positioned_error():
    with pytest.raises(HardwareProfileError) as raised:
        profile_with(GLA_OFFLOAD)
    rendered = raised.value.render()
    assert "states host_offload_forward without host_forward: give both or neither" in rendered
    assert rendered.startswith("hosted.toml:")
    with pytest.raises(HardwareProfileError, match="states host_recompute_backward without host_recompute_forward"):
        profile_with(GLA_HOST + "host_recompute_backward = 1e-3\n")
    with pytest.raises(HardwareProfileError, match="'layer.host_backward' must not be negative"):
        profile_with("host_forward = 1e-3\nhost_backward = -1\n")


def test_each_part_launches_for_its_own_host_time():
    """Stage 0's forward launches the embedding and two mlp blocks at the [overhead] figure and two gla blocks
    at their own: the hybrid's layers launching more than the GLA's are priced as they launch."""
    plain = ProfileCostModel(program_of(), profile_with(""))
    hosted = ProfileCostModel(program_of(), profile_with(GLA_HOST))
    assert seconds(plain, ActionKind.FORWARD) == pytest.approx(5 * OVERHEAD_FORWARD)
    assert seconds(hosted, ActionKind.FORWARD) == pytest.approx(3 * OVERHEAD_FORWARD + 2 * 4e-3)
    assert seconds(hosted, ActionKind.BACKWARD) == pytest.approx(3 * 3 * OVERHEAD_FORWARD + 2 * 9e-3)
    assert hosted.host_bound(TaskId(ActionKind.FORWARD, 0, 0, 0))


def test_a_backward_launches_what_it_reruns():
    """``recompute = mixer`` reruns the gla blocks' forwards inside each backward, so an eager backward also
    pays their launches; ``recompute = mlp`` the mlp blocks'."""
    profile = profile_with(GLA_HOST)
    plain = seconds(ProfileCostModel(program_of(), profile), ActionKind.BACKWARD)
    mixer = seconds(ProfileCostModel(program_of(pipeline="recompute = mixer"), profile), ActionKind.BACKWARD)
    mlp = seconds(ProfileCostModel(program_of(pipeline="recompute = mlp"), profile), ActionKind.BACKWARD)
    assert mixer - plain == pytest.approx(2 * 4e-3)
    assert mlp - plain == pytest.approx(2 * OVERHEAD_FORWARD)


def test_a_part_rerun_under_the_checkpoint_costs_what_was_measured_so():
    """Where a row states its host times under recompute, a unit that reruns that part pays them: its forward
    the part's checkpointed forward (5 ms, not 4), its backward what the rerun adds to the plain one (16 - 9 ms,
    where the rerun forward alone was 4). Units that do not rerun the part, or rerun the whole chunk (``full``:
    not the checkpoint), price it as before."""
    profile = profile_with(GLA_HOST + GLA_RECOMPUTE)
    without = profile_with(GLA_HOST)
    for pipeline in ("", "recompute = mlp", "recompute = full"):
        for kind in ActionKind.FORWARD, ActionKind.BACKWARD:
            program = program_of(pipeline=pipeline)
            assert seconds(ProfileCostModel(program, profile), kind) == pytest.approx(
                seconds(ProfileCostModel(program, without), kind)), (pipeline, kind)
    mixer = program_of(pipeline="recompute = mixer")
    assert seconds(ProfileCostModel(mixer, profile), ActionKind.FORWARD) - seconds(
        ProfileCostModel(mixer, without), ActionKind.FORWARD) == pytest.approx(2 * 1e-3)
    assert seconds(ProfileCostModel(mixer, profile), ActionKind.BACKWARD) - seconds(
        ProfileCostModel(mixer, without), ActionKind.BACKWARD) == pytest.approx(2 * (7e-3 - 4e-3))


def test_offload_hooks_add_host_time_to_the_units_that_copy():
    """Stage 0 of 1f1b copies unit (0, 0) out and back; stage 1 runs F0.1 B0.1 back to back, so that unit keeps
    its tensors (``offload_copies``) and its tasks cost what they cost without offload. A copying unit's forward
    pays each gla block's pack hooks and copies (6 - 4 ms) and its backward their prefetch (10 - 9 ms); blocks
    that the backward reruns save their inputs alone, and pay nothing."""
    profile = profile_with(GLA_HOST + GLA_OFFLOAD)
    plain = ProfileCostModel(program_of(), profile)
    offloaded = ProfileCostModel(program_of(pipeline="offload = true"), profile)
    forward_extra = seconds(offloaded, ActionKind.FORWARD) - seconds(plain, ActionKind.FORWARD)
    assert forward_extra == pytest.approx(2 * 2e-3)
    backward = seconds(offloaded, ActionKind.BACKWARD) - offloaded.copy_waits.get((0, 0, 0), 0.0)
    assert backward - seconds(plain, ActionKind.BACKWARD) == pytest.approx(2 * 1e-3)
    for kind in ActionKind.FORWARD, ActionKind.BACKWARD:
        assert seconds(offloaded, kind, stage=1, chunk=1) == pytest.approx(seconds(plain, kind, stage=1, chunk=1))
    rerun = ProfileCostModel(program_of(pipeline="offload = true recompute = mixer"), profile)
    rerun_plain = ProfileCostModel(program_of(pipeline="recompute = mixer"), profile)
    assert seconds(rerun, ActionKind.FORWARD) == pytest.approx(seconds(rerun_plain, ActionKind.FORWARD))
