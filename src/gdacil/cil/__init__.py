"""The class-incremental experiment: configuration, runner, metrics, checkpoints and results."""

from .config import (
    CompensatorConfig,
    ConfigError,
    ExperimentConfig,
    HeadConfig,
    StrategySpec,
    load_config,
)
from .metrics import IncrementalMetrics, TaskEvaluation, summarize_seeds
from .runner import run_experiment

__all__ = ["CompensatorConfig", "ConfigError", "ExperimentConfig", "HeadConfig",
           "IncrementalMetrics", "StrategySpec", "TaskEvaluation", "load_config",
           "run_experiment", "summarize_seeds"]
