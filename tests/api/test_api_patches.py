"""The typed status patches (llmgw.api.patches) stay in step with the status models they patch."""
from llmgw.api import (
    AdapterPending,
    Condition,
    DrainStatus,
    GitSourceStatus,
    LoraAdapterStatus,
    MemoryEstimate,
    ModelStatus,
    NodeStatus,
    ProfileFit,
    ReplicaStatus,
)
from llmgw.api.patches import (
    AdapterPendingPatch,
    AdapterStatusPatch,
    ConditionPatch,
    DrainStatusPatch,
    GitSourceStatusPatch,
    MemoryEstimatePatch,
    ModelStatusPatch,
    NodeStatusPatch,
    ProfileFitPatch,
    ReplicaStatusPatch,
)

PATCHES = [(NodeStatusPatch, NodeStatus), (ModelStatusPatch, ModelStatus), (ReplicaStatusPatch, ReplicaStatus),
           (ConditionPatch, Condition), (DrainStatusPatch, DrainStatus),
           (GitSourceStatusPatch, GitSourceStatus), (AdapterStatusPatch, LoraAdapterStatus),
           (AdapterPendingPatch, AdapterPending), (MemoryEstimatePatch, MemoryEstimate),
           (ProfileFitPatch, ProfileFit)]


def test_a_patch_names_only_fields_of_its_status():
    for patch, model in PATCHES:
        assert set(patch.__annotations__) <= set(model.model_fields), patch.__name__


def test_a_condition_patch_requires_what_a_condition_requires():
    required = {name for name, f in Condition.model_fields.items() if f.is_required()}
    assert ConditionPatch.__required_keys__ == required


def test_a_drain_patch_gives_the_whole_drain_status():
    # `drain` is one status field: a patch replaces all of it, so it must say all of it.
    assert DrainStatusPatch.__required_keys__ == set(DrainStatus.model_fields)


def test_a_profile_fit_patch_gives_the_whole_entry():
    # status.fit is replaced whole: each entry says every field, as does its estimate.
    assert ProfileFitPatch.__required_keys__ == set(ProfileFit.model_fields)
    assert MemoryEstimatePatch.__required_keys__ == set(MemoryEstimate.model_fields)
