"""A linear softmax head trained with AdamW on pseudo-features sampled from the statistics."""

from __future__ import annotations

import math

import torch

from .._deprecation import renamed_parameters
from .._validation import check_nonnegative, check_positive_int, check_seed, finite_flag
from .base import GaussianHead, stack_rows

__all__ = ["SGDHead"]


class SGDHead(GaussianHead):
    """Linear classifier trained on pseudo-features drawn from ``N(mu_c, Sigma_c)``.

    The schedule follows the LR-RGDA paper's classifier-construction appendix [LR-RGDA] (the
    approach, a classifier aligned on sampled pseudo-features, is SLCA's [SLCA]):
    ``samples_per_class``
    pseudo-features per class, ``T = base_steps + steps_per_class * C`` AdamW steps on minibatches
    of ``batch_size`` (learning rate ``lr``, weight decay ``weight_decay``), cosine-annealed to
    ``min_lr``; the pool is redrawn every ``resample_every`` steps. Early stopping ends training
    when an exponential moving average (factor ``ema``) of the minibatch loss has not improved for
    ``patience`` consecutive steps (``None`` disables it; the reference code's check is
    effectively never reached, so it always runs all ``T`` steps).

    The pseudo-features are standardised by one scalar (centred at the mean of the class means,
    divided by the root mean per-dimension variance) and the standardisation is folded into the
    weights, so the head is the same whatever the units of the features.

    Every draw (initial weights, pools, minibatches) comes from a generator seeded with
    ``seed``: two fits on the same statistics give identical heads.

    Parameters
    ----------
    samples_per_class : int, default 256
    base_steps, steps_per_class : int, default 5000 and 4
    batch_size : int, default 128
    lr, min_lr, weight_decay : float, default 1e-3, 1e-4, 1e-4
    resample_every : int, default 1000
    patience : int or None, default 100
    ema : float, default 0.99
    seed : int, default 0
        Every random choice (initial weights, pools, minibatches) takes this seed. The former
        name ``random_state`` is a deprecated alias.
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`. Priors other than uniform shift the biases
        by ``log(C pi_c)``, since the pool is class-balanced.

    Training that diverges (the loss or the weights become NaN or inf, e.g. with a far too
    large ``lr``) stops at once with a ``ValueError`` naming the step and the learning rate.

    Attributes
    ----------
    n_steps_ : int
        Optimiser steps actually taken.
    loss_curve_ : list of float
        The smoothed loss every ``resample_every`` steps and at the end.

    Notes
    -----
    Forgetting classes (:meth:`~gdacil.heads.base.GaussianHead.forget`) refits with the same
    seed, so it gives bit for bit the head a fresh fit gives on the statistics of the classes
    left: the draws depend only on the classes fitted on, their order and their moments.
    Against a head fitted on samples that never held the classes it is exact as far as those
    moments are: dense statistics (:class:`~gdacil.ClassGaussians`) compute each class's
    moments from its own samples alone, so they agree bit for bit where the batches are the
    same less the forgotten classes' samples; statistics accumulated in other batches agree to
    round-off, which training in float32 does not keep at round-off.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import SGDHead
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(200, 4, generator=g) + 4 * (torch.arange(200) % 2)[:, None]
    >>> stats = ClassGaussians(4).update(X, torch.arange(200) % 2)
    >>> head = SGDHead(base_steps=200, steps_per_class=0).fit(stats)
    >>> head.score(X, torch.arange(200) % 2) > 0.95
    True
    """

    _state_attributes = (*GaussianHead._state_attributes, "loss_curve_", "n_steps_")

    @renamed_parameters(random_state="seed")
    def __init__(self, *, samples_per_class=256, base_steps=5000, steps_per_class=4, batch_size=128,
                 lr=1e-3, min_lr=1e-4, weight_decay=1e-4, resample_every=1000, patience=100,
                 ema=0.99, seed=0, priors=None, device=None, dtype="float64",
                 class_batch_size="auto"):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.samples_per_class, self.base_steps = samples_per_class, base_steps
        self.steps_per_class, self.batch_size = steps_per_class, batch_size
        self.lr, self.min_lr, self.weight_decay = lr, min_lr, weight_decay
        self.resample_every, self.patience, self.ema = resample_every, patience, ema
        self.seed = seed

    def _check_params(self) -> None:
        super()._check_params()
        for name in ("samples_per_class", "batch_size", "resample_every"):
            check_positive_int(getattr(self, name), name)
        for name in ("base_steps", "steps_per_class"):
            check_positive_int(getattr(self, name), name, minimum=0)
        for name in ("lr", "min_lr", "weight_decay"):
            check_nonnegative(getattr(self, name), name)
        if self.patience is not None:
            check_positive_int(self.patience, "patience")
        if not 0.0 <= float(self.ema) < 1.0:
            raise ValueError(f"ema must lie in [0, 1); got {self.ema!r}")
        check_seed(self.seed)

    def n_steps_for(self, n_classes: int) -> int:
        """The step budget ``T = base_steps + steps_per_class * C``."""
        return self.base_steps + self.steps_per_class * n_classes

    def _diverged(self, step: int, total: int, what: str):
        raise ValueError(
            f"SGDHead: training diverged at step {step} of {total}: {what}; the learning rate "
            f"lr={self.lr!r} is too large for these statistics: lower it (and min_lr)")

    def _build(self, stats, log_priors):
        C, d = stats.n_classes, stats.dim
        gen = torch.Generator().manual_seed(self.seed)
        total = self.n_steps_for(C)
        if total < 1:
            raise ValueError("SGDHead: base_steps + steps_per_class * C must be at least 1")
        bound = 1.0 / math.sqrt(d)
        W = ((torch.rand(C, d, generator=gen) * 2 - 1) * bound).to(self.device_).requires_grad_()
        b = ((torch.rand(C, generator=gen) * 2 - 1) * bound).to(self.device_).requires_grad_()
        opt = torch.optim.AdamW([W, b], lr=self.lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total, eta_min=self.min_lr)
        smoothed, best, since_best, self.loss_curve_ = None, math.inf, 0, []
        step = 0
        factors = stats.sampling_factors()  # factor once, redraw the pool many times
        center, unit = _standardizer(stats)
        while step < total:
            X, y = stats.sample(self.samples_per_class, generator=gen, factors=factors,
                                dtype=torch.float32)
            X = ((X.double() - center) / unit).float().to(self.device_)
            target = stats.positions(y.tolist()).to(self.device_)
            for _ in range(min(self.resample_every, total - step)):
                idx = torch.randint(0, X.shape[0], (self.batch_size,), generator=gen).to(self.device_)
                loss = torch.nn.functional.cross_entropy(torch.addmm(b, X[idx], W.T), target[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                try:
                    opt.step()
                except RuntimeError as err:  # a step size beyond the float32 range
                    if "overflow" not in str(err):
                        raise
                    self._diverged(step + 1, total, f"the optimiser step failed ({err})")
                sched.step()
                step += 1
                value = float(loss.detach())
                if not math.isfinite(value):
                    self._diverged(step, total, f"the loss became {value}")
                smoothed = value if smoothed is None else self.ema * smoothed + (1 - self.ema) * value
                if smoothed < best * (1.0 - 1e-4):  # loss >= 0
                    best, since_best = smoothed, 0
                else:
                    since_best += 1
                if self.patience is not None and since_best >= self.patience:
                    break
            self.loss_curve_.append(smoothed)
            if self.patience is not None and since_best >= self.patience:
                break
        self.n_steps_ = step
        if not bool(finite_flag(W.detach())) or not bool(finite_flag(b.detach())):
            self._diverged(step, total, "the weights became NaN or inf")
        # trained on (x - center) / unit: fold the standardisation into the weights
        W = W.detach().double().cpu() / unit
        bias = b.detach().double().cpu() - W @ center + log_priors + math.log(C)
        return (*stack_rows(W, bias), 1.0)


def _standardizer(stats) -> tuple[torch.Tensor, float]:
    """``(center, unit)``: the mean of the class means and the root mean per-dimension variance
    around it (within and between classes). Training on ``(x - center) / unit`` makes the fitted
    classifier the same whatever the units of the features."""
    mu = stats.means.cpu()
    center = mu.mean(0)
    variance = float(stats.average_covariance().trace()) / stats.dim
    variance += float((mu - center).square().mean())
    return center, math.sqrt(variance) if variance > 0 else 1.0
