"""Exceptions shared across gdacil."""

__all__ = ["NotFittedError"]


class NotFittedError(ValueError, AttributeError):
    """A head, compensator or estimator was used before it was fitted.

    A ``ValueError`` and an ``AttributeError``, like scikit-learn's ``NotFittedError``, so code
    written for either catches it, and ``hasattr`` on a fitted-only property returns False.
    """
