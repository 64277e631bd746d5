"""The class-incremental experiment: configuration, runner, metrics, checkpoints and results."""

from .config import ConfigError, ExperimentConfig, HeadConfig, load_config
from .metrics import IncrementalMetrics, TaskEvaluation, summarize_seeds
from .runner import run_experiment

__all__ = ["ConfigError", "ExperimentConfig", "HeadConfig", "IncrementalMetrics",
           "TaskEvaluation", "load_config", "run_experiment", "summarize_seeds"]
