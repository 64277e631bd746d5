"""What a :class:`~gdacil.learner.Learner` is made of: one validated, JSON-able configuration.

Every part is built by its registry name, as in experiment configs (:mod:`gdacil.cil.config`),
so a saved model records names and options, never code:

======================  ============================================================================
field                   what
======================  ============================================================================
``backbone``            a :data:`gdacil.backbones.BACKBONES` name (default ``minilm``), with
                        ``backbone_options`` for its factory
``head``                a head built from class statistics (:data:`gdacil.heads.HEADS`; default the
                        experiments' default, ``lr_rgda``), with ``head_params``
``strategy``            the Stage-1 strategy, a :class:`~gdacil.cil.config.StrategySpec` (a name,
                        or ``{"name": ..., **overrides}``; default ``frozen``)
``compensator``         moves old classes' statistics after the strategy trains the backbone, a
                        :class:`~gdacil.cil.config.CompensatorConfig` (a name or a mapping; default
                        ``hopdc``, gdacil's recommended preset); unused while frozen
``statistics``          a :class:`~gdacil.cil.config.StatisticsConfig` (``"dense"``, ``"lowrank"``
                        or its fields; default: dense :class:`~gdacil.ClassGaussians`)
``anchors``             raw samples kept (a seeded reservoir) to fit the compensator; only kept
                        when the strategy trains the backbone on later tasks
``calibration_share``   the share of each class's samples in a learn that each calibration fold
                        holds out (``round(1 / share)`` folds, every sample scored by a head
                        that did not learn it) to calibrate rejection, probabilities and
                        conformal sets (:mod:`gdacil.calibration`; default 0.1, 0: none)
``reject_rate``         the default target false-rejection rate of ``predict(..., reject=True)``
``novelty``             the novelty score of rejection (:mod:`gdacil.novelty`; default: the
                        head's)
``precision``           the backbone's forward passes, as experiment configs set
                        ``backbone.precision``: ``auto`` (default: bf16 where it is native, fp32
                        elsewhere), ``fp32``, ``bf16`` or ``fp16`` (frozen backbones only)
======================  ============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._validation import check_positive_int
from ..calibration import CALIBRATION_SHARE
from ..cil.config import (
    BackboneConfig,
    CompensatorConfig,
    ConfigError,
    HeadConfig,
    StatisticsConfig,
    StrategySpec,
    _check_head_params,
)
from ..typed_config import TypedConfig

__all__ = ["LearnerConfig"]

_DEFAULT_BACKBONE = BackboneConfig().name
_DEFAULT_HEAD = HeadConfig().name


def _named(cls: type[TypedConfig]):
    """A field parser that also takes a bare registry name for ``{"name": name}``."""
    def parse(value, path: str):
        return cls.from_dict({"name": value} if isinstance(value, str) else value, where=path)
    return parse


def _number(value) -> bool:
    """Whether ``value`` is a real number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _statistics(value, path: str) -> StatisticsConfig:
    """``"dense"`` or ``"lowrank"`` for ``{"storage": value}``, else the config's fields."""
    return StatisticsConfig.from_dict({"storage": value} if isinstance(value, str) else value,
                                      where=path)


@dataclass
class LearnerConfig(TypedConfig):
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
    strategy : StrategySpec, str or dict
        Stage-1 strategy name, or ``{"name": ..., "defaults": ..., **overrides}``.
    compensator : CompensatorConfig, str or dict
        Compensator name, or ``{"name": ..., "defaults": ..., **hyperparameters}``.
    statistics : StatisticsConfig, str or dict
        ``"dense"``, ``"lowrank"``, or :class:`~gdacil.cil.config.StatisticsConfig` fields.
    anchors : int
        Size of the anchor reservoir (the LR-RGDA paper fits HopDC on 1024 anchors).
    include_current : bool
        Also fit the compensator on the samples being learned (the LR-RGDA paper's choice).
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
    calibration_share : float
        Share of each class's samples in a learn that each calibration fold holds out: the
        learn's samples are dealt into ``round(1 / share)`` folds (at least two), and each fold
        is scored by a copy of the head refitted without it, so every sample calibrates the
        model and all are learned. More folds make the records more like new inputs and cost
        one head refit each; 0 disables calibration. Needs dense statistics; see
        docs/learner.md, "Saying I don't know".
    reject_rate : float
        Default target false-rejection rate of ``predict(..., reject=True)``: the share of
        inputs of known classes it may call unknown.
    novelty : str, optional
        The novelty score of rejection (:data:`gdacil.novelty.NOVELTY_SCORES`); None: the head's
        default (``"relative_likelihood"`` for LR-RGDA). The calibration records which score
        its records have, and predictions score new inputs with that one.
    precision : str
        Arithmetic of the backbone's forward passes (learning, predicting, Stage-1 training):
        ``"auto"`` resolves on the machine that runs the model, to ``"bf16"`` where bfloat16
        is native (:func:`gdacil._hardware.native_bfloat16`) and ``"fp32"`` elsewhere, as
        experiments resolve ``backbone.precision`` (:func:`gdacil.backbones.base.resolve_precision`);
        or ``"fp32"``, ``"bf16"``, ``"fp16"`` (only with the frozen strategy). Features come
        back as float32 and statistics are float64 either way. Models saved before gdacil kept
        it run fp32, as they did.
    """

    backbone: str = _DEFAULT_BACKBONE
    backbone_options: dict = field(default_factory=dict)
    head: str = _DEFAULT_HEAD
    head_params: dict = field(default_factory=dict)
    strategy: StrategySpec = field(default_factory=lambda: StrategySpec("frozen"),
                                   metadata={"parse": _named(StrategySpec)})
    compensator: CompensatorConfig = field(default_factory=lambda: CompensatorConfig("hopdc"),
                                           metadata={"parse": _named(CompensatorConfig)})
    statistics: StatisticsConfig = field(default_factory=StatisticsConfig,
                                         metadata={"parse": _statistics})
    anchors: int = 1024
    include_current: bool = True
    seed: int = 0
    batch_size: int = 32
    ddof: int = 0
    store_backbone: bool = False
    calibration_share: float = CALIBRATION_SHARE
    reject_rate: float = 0.05
    novelty: str | None = None
    precision: str = "auto"

    def __post_init__(self):
        self._coerce_nested()
        problems = []
        for check in (self._check_backbone, self._check_head, self.build_strategy,
                      self._check_compensator, self._check_numbers, self._check_precision):
            try:
                check()
            except (ConfigError, TypeError, ValueError, KeyError) as exc:
                problems.append(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args
                                else str(exc))
        if problems:
            raise ConfigError("; ".join(problems))

    # ------------------------------------------------------------------ checks
    def _check_backbone(self) -> None:
        from ..backbones import BACKBONES, check_backbone_options

        if not isinstance(self.backbone, str):
            raise ConfigError(f"backbone: expected a registry name; got {self.backbone!r}")
        BACKBONES[self.backbone]  # an unknown name lists the known ones
        if not isinstance(self.backbone_options, dict):
            raise ConfigError(f"backbone_options: expected a mapping; got "
                              f"{self.backbone_options!r}")
        try:  # an option the backbone does not take, before anything is built
            check_backbone_options(self.backbone, self.backbone_options)
        except ValueError as exc:
            raise ConfigError(f"backbone_options: {exc}") from None

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

    def _check_precision(self) -> None:
        from ..backbones.base import check_precision

        check_precision(self.precision, self.strategy.name)

    def _check_compensator(self) -> None:
        if self.compensator.anchors is not None:
            raise ConfigError("compensator.anchors: a learner's compensator fits on its anchor "
                              "reservoir; set its size with `anchors`")
        try:
            self.build_compensator()._check_params()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"compensator: {exc}") from None

    def _check_numbers(self) -> None:
        for name, low in (("anchors", 0), ("seed", 0), ("batch_size", 1)):
            check_positive_int(getattr(self, name), name, minimum=low)
        if self.ddof not in (0, 1) or isinstance(self.ddof, bool):
            raise ConfigError(f"ddof: expected 0 or 1; got {self.ddof!r}")
        for name in ("include_current", "store_backbone"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: expected true or false; got {getattr(self, name)!r}")
        share, rate = self.calibration_share, self.reject_rate
        if not (_number(share) and (share == 0 or 0 < share < 1)):
            raise ConfigError(f"calibration_share: expected 0 (no calibration) or a share "
                              f"strictly between 0 and 1; got {share!r}")
        if not (_number(rate) and 0 < rate < 1):
            raise ConfigError(f"reject_rate: expected a rate strictly between 0 and 1; got "
                              f"{rate!r}")
        if self.novelty is not None:
            from ..novelty import NOVELTY_SCORES

            if self.novelty not in NOVELTY_SCORES:
                raise ConfigError(f"novelty: expected null (the head's default) or one of "
                                  f"{', '.join(NOVELTY_SCORES)}; got {self.novelty!r}")

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
        return self.strategy.build()

    def build_compensator(self):
        return self.compensator.build()

    def build_backbone(self, device=None, precision: str | None = None):
        """The backbone, on ``device`` when given (else as ``backbone_options`` say), running
        in ``precision`` (default: the config's; "auto" resolved for its device)."""
        from ..backbones import build_backbone

        options = dict(self.backbone_options)
        if device is not None:
            options["device"] = device
        return build_backbone(self.backbone, **options).set_precision(
            precision or self.precision)
