"""What a :class:`~gdacil.learner.Learner` is made of: one validated, JSON-able configuration.

Every part is built by its registry name, as in experiment configs (:mod:`gdacil.cil.config`),
so a saved model records names and options, never code:

==================  ==============================================================================
field               what
==================  ==============================================================================
``backbone``        a :data:`gdacil.backbones.BACKBONES` name (default ``minilm``), with
                    ``backbone_options`` for its factory
``head``            a head built from class statistics (:data:`gdacil.heads.HEADS`; default the
                    experiments' default, ``lr_rgda``), with ``head_params``
``strategy``        the Stage-1 strategy, ``{"name": ..., **overrides}`` (default ``frozen``)
``compensator``     moves old classes' statistics after the strategy trains the backbone
                    (default ``hopdc``, gdacil's recommended preset); unused while frozen
``statistics``      :class:`~gdacil.cil.config.StatisticsConfig` fields (default: dense
                    :class:`~gdacil.ClassGaussians`)
``anchors``         raw samples kept (a seeded reservoir) to fit the compensator; only kept
                    when the strategy trains the backbone on later tasks
==================  ==============================================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..cil.config import (
    BackboneConfig,
    ConfigError,
    HeadConfig,
    StatisticsConfig,
    _check_head_params,
)

__all__ = ["LearnerConfig"]

_DEFAULT_BACKBONE = BackboneConfig().name
_DEFAULT_HEAD = HeadConfig().name


def _spec(value, what: str) -> dict:
    """``{"name": value}`` for a name, a copy of a mapping with a ``name``."""
    if isinstance(value, str):
        return {"name": value}
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return dict(value)
    raise ConfigError(f"{what}: expected a registry name or a mapping with a 'name'; got {value!r}")


@dataclass
class LearnerConfig:
    """The parts of a learner and their settings (see the module docstring).

    Parameters
    ----------
    backbone : str
        Backbone registry name (``gdacil list backbones``).
    backbone_options : dict
        Keyword arguments of the backbone's factory (``{"size": 160}``, ``{"config": {...}}``).
    head : str
        Head registry name; heads that learn from features (``ranpac``, ``acil``, ``rbf_lda``)
        cannot forget classes and are refused.
    head_params : dict
        The head's constructor arguments.
    strategy : str or dict
        Stage-1 strategy name, or ``{"name": ..., "defaults": ..., **overrides}``.
    compensator : str or dict
        Compensator name, or ``{"name": ..., "defaults": ..., **hyperparameters}``.
    statistics : str or dict
        ``"dense"``, ``"lowrank"``, or :class:`~gdacil.cil.config.StatisticsConfig` fields.
    anchors : int
        Size of the anchor reservoir (the paper fits HopDC on 1024 anchors).
    include_current : bool
        Also fit the compensator on the samples being learned (the paper's choice).
    seed : int
        Seeds every random draw (strategy training, anchor reservoir, per-class caps).
    batch_size : int
        Samples per forward pass.
    ddof : {0, 1}
        Covariance normalisation of the statistics.
    store_backbone : bool
        Store the backbone's weights in every saved version even when it is frozen (they always
        are when a strategy trains it). Makes a model independent of how its backbone is built,
        e.g. of a randomly initialised test backbone.
    """

    backbone: str = _DEFAULT_BACKBONE
    backbone_options: dict = field(default_factory=dict)
    head: str = _DEFAULT_HEAD
    head_params: dict = field(default_factory=dict)
    strategy: dict = field(default_factory=lambda: {"name": "frozen"})
    compensator: dict = field(default_factory=lambda: {"name": "hopdc"})
    statistics: dict = field(default_factory=dict)
    anchors: int = 1024
    include_current: bool = True
    seed: int = 0
    batch_size: int = 32
    ddof: int = 0
    store_backbone: bool = False

    def __post_init__(self):
        problems = []
        for check in (self._check_backbone, self._check_head, self._check_strategy,
                      self._check_compensator, self._check_statistics, self._check_numbers):
            try:
                check()
            except (ConfigError, TypeError, ValueError, KeyError) as exc:
                problems.append(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args
                                else str(exc))
        if problems:
            raise ConfigError("; ".join(problems))

    # ------------------------------------------------------------------ checks
    def _check_backbone(self) -> None:
        from ..backbones import BACKBONES

        if not isinstance(self.backbone, str):
            raise ConfigError(f"backbone: expected a registry name; got {self.backbone!r}")
        BACKBONES[self.backbone]  # an unknown name lists the known ones
        if not isinstance(self.backbone_options, dict):
            raise ConfigError(f"backbone_options: expected a mapping; got "
                              f"{self.backbone_options!r}")

    def _check_head(self) -> None:
        if not isinstance(self.head_params, dict):
            raise ConfigError(f"head_params: expected a mapping; got {self.head_params!r}")
        head = HeadConfig(self.head, dict(self.head_params))
        _check_head_params(head, "head")
        if head.streaming:
            raise ConfigError(f"head: {self.head!r} learns from features, not from class "
                              "statistics, so a learner could not forget its classes or move "
                              "them with a compensator; choose one of gdacil.heads.HEADS "
                              "(ncm, lda, qda, rgda, lr_rgda, sgd, fecam)")

    def _check_strategy(self) -> None:
        self.strategy = _spec(self.strategy, "strategy")
        self.build_strategy()

    def _check_compensator(self) -> None:
        self.compensator = _spec(self.compensator, "compensator")
        try:
            self.build_compensator()._check_params()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"compensator: {exc}") from None

    def _check_statistics(self) -> None:
        if isinstance(self.statistics, str):
            self.statistics = {"storage": self.statistics}
        if not isinstance(self.statistics, dict):
            raise ConfigError(f"statistics: expected 'dense', 'lowrank' or a mapping; got "
                              f"{self.statistics!r}")
        self.statistics_config()

    def _check_numbers(self) -> None:
        for name, low in (("anchors", 0), ("seed", 0), ("batch_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name}: expected an integer >= {low}; got {value!r}")
        if self.ddof not in (0, 1) or isinstance(self.ddof, bool):
            raise ConfigError(f"ddof: expected 0 or 1; got {self.ddof!r}")
        for name in ("include_current", "store_backbone"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: expected true or false; got {getattr(self, name)!r}")

    # ------------------------------------------------------------------ builders
    @property
    def trains(self) -> bool:
        """Whether the strategy changes the backbone (on some task)."""
        return self.build_strategy().config.params != "none"

    def build_head(self):
        """A new, unfitted head."""
        return HeadConfig(self.head, dict(self.head_params)).build()

    def build_strategy(self):
        """The Stage-1 :class:`gdacil.adapt.Strategy` (as experiment configs build it)."""
        from ..adapt import build_strategy

        spec = dict(self.strategy)
        return build_strategy(spec.pop("name"), defaults=spec.pop("defaults", "paper"), **spec)

    def build_compensator(self):
        from ..drift import build_compensator

        return build_compensator(dict(self.compensator))

    def statistics_config(self) -> StatisticsConfig:
        try:
            return StatisticsConfig(**self.statistics)
        except TypeError as exc:
            raise ConfigError(f"statistics: {exc}") from None

    def build_backbone(self, device=None):
        """The backbone, on ``device`` when given (else as ``backbone_options`` say)."""
        from ..backbones import build_backbone

        options = dict(self.backbone_options)
        if device is not None:
            options["device"] = device
        return build_backbone(self.backbone, **options)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LearnerConfig:
        """The config of :meth:`to_dict`; unknown keys are refused with a :class:`ConfigError`."""
        if not isinstance(data, dict):
            raise ConfigError(f"a learner config is a mapping; got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown learner setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)
