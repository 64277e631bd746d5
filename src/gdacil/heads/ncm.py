"""Nearest class mean (NCM): Euclidean or cosine similarity to the class means."""

from __future__ import annotations

import torch

from .base import GaussianHead, stack_rows

__all__ = ["NCM"]


class NCM(GaussianHead):
    """Nearest-class-mean classifier.

    Parameters
    ----------
    metric : {"euclidean", "cosine"}, default "euclidean"
        Euclidean scores are ``-1/2 ||x - mu_c||^2 + log pi_c`` (the Gaussian log-likelihood with
        identity covariance, so ``predict_proba`` is its posterior); cosine scores are
        ``cos(x, mu_c) + log pi_c``, as in the reference code.
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`.

    References
    ----------
    [NCM] T. Mensink, J. Verbeek, F. Perronnin and G. Csurka. Distance-Based Image
    Classification: Generalizing to New Classes at Near-Zero Cost. IEEE Transactions on Pattern
    Analysis and Machine Intelligence 35(11):2624-2637, 2013. doi:10.1109/TPAMI.2013.83

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import NCM
    >>> X = torch.tensor([[0.0, 0.0], [0.2, 0.0], [5.0, 5.0], [5.2, 5.0]])
    >>> stats = ClassGaussians(2).update(X, [0, 0, 1, 1])
    >>> NCM().fit(stats).predict(torch.tensor([[4.0, 4.5]])).tolist()
    [1]
    """

    def __init__(self, metric="euclidean", *, priors=None, device=None, dtype="float64",
                 class_batch_size="auto"):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.metric = metric

    def _check_params(self) -> None:
        super()._check_params()
        if self.metric not in ("euclidean", "cosine"):
            raise ValueError(f"metric must be 'euclidean' or 'cosine'; got {self.metric!r}")

    def _build(self, stats, log_priors):
        mu = stats.means.cpu()
        if self.metric == "cosine":
            norms = mu.norm(dim=1, keepdim=True)
            if (norms == 0).any():
                raise ValueError("cosine NCM: a class mean is the zero vector")
            return (*stack_rows(mu / norms, log_priors), 1.0)
        return (*stack_rows(mu, -0.5 * (mu * mu).sum(1) + log_priors), 1.0)

    def _prepare(self, X):
        X = super()._prepare(X)
        if self.metric == "cosine":
            norms = X.norm(dim=1, keepdim=True)
            if (norms == 0).any():
                raise ValueError("cosine NCM: a sample is the zero vector")
            X = X / norms
        return X

    def _mixture_covariance(self, stats):
        """Euclidean: the identity, every class's covariance."""
        if self.metric != "euclidean":
            return None
        return torch.eye(stats.dim, dtype=torch.float64, device=self.device_)

    def _density_offset(self, X):
        """Euclidean: none, the scores are log-densities under identity covariances."""
        return X.new_zeros(X.shape[0]).double() if self.metric == "euclidean" else None

    def _sample_offset(self, X):
        if self.metric == "euclidean":  # -1/2 ||x||^2 completes -1/2 ||x - mu_c||^2
            return -0.5 * (X * X).sum(1, keepdim=True)
        return None
