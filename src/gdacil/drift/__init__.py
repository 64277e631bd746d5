"""Drift compensation: move stored class statistics into a fine-tuned backbone's feature space.

Every compensator follows one contract (:class:`Compensator`)::

    comp = build_compensator("hopdc")                         # gdacil's recommended HopDC
    comp = build_compensator("hopdc", defaults="paper")       # the LR-RGDA paper's, exactly
    comp.fit(old_anchor_features, new_anchor_features)      # same N unlabelled anchors
    new_stats = comp.transform(stats, labels=old_classes)   # a new ClassGaussians

=================  ==============================================================  ============
name               what it does                                                    moments
=================  ==============================================================  ============
``identity``       nothing (the SeqFT baseline)                                    --
``hopdc``          top-k Hopfield retrieval of anchor drifts for pseudo-samples    mean, cov
``sdc``            Gaussian-kernel weighted anchor drift at the class mean         mean
``sldc_linear``    ridge-regression linear map (alpha1-SLDC)                       mean, cov
``sldc_weak``      gated residual MLP pushed through pseudo-samples                mean, cov
``oracle``         recomputed from true new features (needs labelled samples)      mean, cov
=================  ==============================================================  ============

:func:`drift_report` measures compensated statistics against the oracle.
"""

from __future__ import annotations

from typing import Any, cast

from ..registry import Registry
from .base import Compensator, Identity, NotFittedError
from .diagnostics import class_errors, drift_report, gaussian_w2
from .hopdc import HopDC
from .oracle import Oracle
from .sdc import SDC
from .sldc import LinearSLDC, WeakNonlinearSLDC

__all__ = [
    "COMPENSATORS",
    "SDC",
    "Compensator",
    "HopDC",
    "Identity",
    "LinearSLDC",
    "NotFittedError",
    "Oracle",
    "WeakNonlinearSLDC",
    "build_compensator",
    "class_errors",
    "drift_report",
    "gaussian_w2",
]

#: Registry of compensator names to classes.
COMPENSATORS = Registry("compensator", {
    cls.name: cls for cls in (Identity, HopDC, SDC, LinearSLDC, WeakNonlinearSLDC, Oracle)
})


def build_compensator(name: str | dict[str, Any], **config) -> Compensator:
    """A compensator from its registry name, a preset and hyperparameters.

    ``name`` may also be a dict as written in experiment configs or returned by
    :meth:`Compensator.get_config` (its ``"name"`` entry picks the class, the rest are
    hyperparameters; ``config`` overrides them). The optional ``defaults`` entry names the preset
    the hyperparameters start from (:attr:`Compensator.presets`; ``"recommended"``, the
    constructor's defaults, when absent): ``{"name": "hopdc", "defaults": "paper", "tau": 0.1}``
    is the LR-RGDA paper's HopDC with ``tau = 0.1``.

    >>> from gdacil.drift import build_compensator
    >>> build_compensator("hopdc", tau=0.1).tau
    0.1
    >>> build_compensator({"name": "hopdc", "defaults": "paper"}).match_moments
    False
    >>> build_compensator(build_compensator("sdc", sigma=0.5).get_config()).sigma
    0.5
    """
    if isinstance(name, dict):
        config = {**{k: v for k, v in name.items() if k != "name"}, **config}
        name = cast(str, name.get("name"))  # None if missing: the lookup names the known ones
    cls = cast("type[Compensator]", COMPENSATORS[name])
    preset = config.pop("defaults", "recommended")
    try:
        return cls.from_preset(preset, **config)
    except TypeError as err:
        raise ValueError(f"bad configuration for compensator {name!r}: {err}") from None
