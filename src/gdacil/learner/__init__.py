"""A continual classifier people can deploy: learn classes from folders or files of raw
samples, predict, forget, and keep every saved version.

>>> from gdacil.learner import Learner                                     # doctest: +SKIP
>>> learner = Learner("efficientnet-lite0")                               # doctest: +SKIP
>>> learner.learn("photos/")           # one sub-folder of images per class  # doctest: +SKIP
>>> learner.predict(["new.jpg"], top_k=3)[0].label                         # doctest: +SKIP
>>> learner.save("my-model")           # a new version, made current atomically  # doctest: +SKIP
>>> Learner.load("my-model").learn("more-photos/")                        # doctest: +SKIP

- :class:`Learner` (:mod:`gdacil.learner.learner`): backbone + optional Stage-1 strategy +
  compensator + class statistics + head, configured by :class:`LearnerConfig`;
- :mod:`gdacil.learner.bundle`: the versioned model directory (:func:`versions`,
  :func:`rollback`);
- :mod:`gdacil.learner.data`: what ``learn`` reads;
- :mod:`gdacil.learner.serve`: ``gdacil serve``, the model behind an HTTP JSON API, with
  :mod:`gdacil.learner.guards` (what a browser page may send), :mod:`gdacil.learner.access`
  (who may change the model: a bearer token), :mod:`gdacil.learner.inbox` (the inputs answered
  unknown, kept for a person to label), :mod:`gdacil.learner.metrics` (``/metrics``) and the
  console page at ``/`` (``gdacil/learner/console/``);
- :mod:`gdacil.learner.cli`: ``gdacil learn / predict / calibrate / info / forget / versions /
  rollback / serve``.

See docs/learner.md.
"""

import importlib

#: Public names and their modules, imported on first use (``gdacil`` builds its parser from
#: :mod:`gdacil.learner.cli` at every start, which must not pay for heads and backbones)
_EXPORTS = {
    "BundleError": "bundle",
    "VersionInfo": "bundle",
    "current_version": "bundle",
    "rollback": "bundle",
    "versions": "bundle",
    "LearnerConfig": "config",
    "LearnReport": "learner",
    "Learner": "learner",
    "Prediction": "learner",
    "UnknownClassError": "learner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
