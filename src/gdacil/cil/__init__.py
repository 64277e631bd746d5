"""The class-incremental model and experiment: the one task step
(:class:`IncrementalModel`), configuration, runner, metrics, checkpoints and results."""

from .config import (
    CompensatorConfig,
    ConfigError,
    ExperimentConfig,
    HeadConfig,
    StrategySpec,
    load_config,
)
from .metrics import IncrementalMetrics, TaskEvaluation, summarize_seeds
from .model import IncrementalModel, TaskData
from .runner import run_experiment

__all__ = ["CompensatorConfig", "ConfigError", "ExperimentConfig", "HeadConfig",
           "IncrementalMetrics", "IncrementalModel", "StrategySpec", "TaskData",
           "TaskEvaluation", "load_config", "run_experiment", "summarize_seeds"]
