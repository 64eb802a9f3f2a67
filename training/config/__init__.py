"""The training config: our own keys as documented, frozen dataclasses (``schema``), loaded from
dicts, YAML or Hydra-style overrides, and the name tables of other dialects (TRL's GRPOConfig
names, verl's, rLLM's remote trainers') that their owners register (``names``). The config knows
no backend. ``secrets`` resolves ``{"$secret": NAME}`` references in agent and environment arguments.
"""

from training.config.schema import DataConfig, ModelConfig, OptimConfig, LOSS_AGG_MODES, POLICY_LOSS_MODES, PolicyLossConfig, ActorConfig, ValKwargsConfig, RolloutConfig, ActorRolloutRefConfig, FilterGroupsConfig, ADV_ESTIMATORS, AlgorithmConfig, TrainerConfig, AgentLoopConfig, EnvLoopConfig, WorkflowLoopConfig, STEPWISE_MODES, StepwiseAdvantageConfig, CompactFilteringConfig, RejectionSampleConfig, SdkStoreConfig, SdkProcessingConfig, SdkProxyConfig, SdkConfig, RllmConfig, OverlongBufferConfig, RewardModelConfig, REMOTE_LOSSES, RemoteConfig, Config, ConfigInput, UNIFIED_NAMES, UNIFIED_SECTIONS, translate_unified_names, valid_keys, location_keys, parse_overrides, flatten, to_dict, from_dict, unknown_key, close_key

from training.errors import ConfigError, Problems

__all__ = [
    "ConfigError",
    "Problems",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_MODES",
    "PolicyLossConfig",
    "ActorConfig",
    "ValKwargsConfig",
    "RolloutConfig",
    "ActorRolloutRefConfig",
    "FilterGroupsConfig",
    "ADV_ESTIMATORS",
    "AlgorithmConfig",
    "TrainerConfig",
    "AgentLoopConfig",
    "EnvLoopConfig",
    "WorkflowLoopConfig",
    "STEPWISE_MODES",
    "StepwiseAdvantageConfig",
    "CompactFilteringConfig",
    "RejectionSampleConfig",
    "SdkStoreConfig",
    "SdkProcessingConfig",
    "SdkProxyConfig",
    "SdkConfig",
    "RllmConfig",
    "OverlongBufferConfig",
    "RewardModelConfig",
    "REMOTE_LOSSES",
    "RemoteConfig",
    "Config",
    "ConfigInput",
    "UNIFIED_NAMES",
    "UNIFIED_SECTIONS",
    "translate_unified_names",
    "valid_keys",
    "location_keys",
    "parse_overrides",
    "flatten",
    "to_dict",
    "from_dict",
    "unknown_key",
    "close_key",
]
