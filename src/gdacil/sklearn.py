"""scikit-learn estimators over the gdacil heads, with class-incremental ``partial_fit``.

:class:`LRRGDAClassifier`, :class:`RGDAClassifier`, :class:`QDAClassifier`,
:class:`LDAClassifier` and :class:`NCMClassifier` wrap the heads of :mod:`gdacil.heads` in the
scikit-learn estimator API: numpy in, numpy out, any label type, ``get_params``/``set_params``,
``clone``, pipelines, ``score``. So do, for the methods users compare against,
:class:`FeCAMClassifier` (:class:`~gdacil.heads.FeCAM`), :class:`RanPACClassifier`,
:class:`ACILClassifier` and :class:`RBFLDAClassifier` (the mapped heads
:class:`~gdacil.heads.RanPAC`, :class:`~gdacil.heads.ACIL`, :class:`~gdacil.heads.RBFLDA`; see
"The anchor heads" below). Every estimator's parameters are its head's: its ``__init__`` is made
from the head's signature (same names, order and defaults; a parameter is declared once, in the
head) and stores each argument, as scikit-learn asks. They all pass
``sklearn.utils.estimator_checks.check_estimator`` with no check skipped.

Class-incremental learning
--------------------------
``partial_fit(X, y)`` accepts classes never seen before; there is no ``classes=`` to declare up
front (scikit-learn's own incremental classifiers need one, scikit-learn#30042). The estimator
keeps the per-class count, mean and scatter of everything it has seen in a
:class:`~gdacil.ClassGaussians` (``stats_``; the mapped heads keep pooled statistics instead, see
"The anchor heads") and rebuilds the head from them after every call, so fitting in shards, in
any order, gives the model of fitting everything at once (up to round-off).
The head object ``head_`` is kept across ``partial_fit`` calls: :class:`~gdacil.heads.LRRGDA`
caches the eigenpairs of each class and re-decomposes only the classes that are new or received
samples (``head_.n_decomposed_`` says how many). ``fit`` starts from scratch.

LR-RGDA's default ``decomposition="eigh"`` is exact. With ``decomposition="randomized"`` (used
when ``rank + oversample < n_features``) each class's random test matrix is seeded from
``seed`` and the class's internal id, its order of first appearance; sharded
``partial_fit`` and one ``fit`` may number classes differently and then agree to the accuracy of
the converged randomized decomposition (residuals below 1e-10 of the top eigenvalue), not to
round-off.

``partial_fit`` also takes an optional ``classes=``, for code written against scikit-learn's
incremental API: every label of ``y`` must be listed there, but a class enters ``classes_`` only
once it has samples (a Gaussian needs data).

``set_params`` between ``partial_fit`` calls takes effect at the next call (the head is rebuilt
or re-solved from all the statistics), except for the parameters the statistics themselves depend
on: FeCAM's ``tukey``, ``l2`` and ``ddof`` and the mapped heads' map (``dim_out``,
``buffer_size``, ``bandwidth``, ``seed``). Changing one of those between ``partial_fit`` calls
raises a ``ValueError`` (nothing changes); ``fit`` starts afresh with the new value.

The anchor heads
----------------
:class:`FeCAMClassifier` transforms every sample first (signed Tukey power, optional L2
normalisation: :meth:`gdacil.heads.FeCAM.transform`); ``stats_`` holds the per-class statistics
of the transformed features, what :meth:`gdacil.heads.FeCAM.fit_stats` takes, and the head
transforms the samples it scores. Its scores are minus half FeCAM's squared Mahalanobis
distance plus the log-prior (no log-determinant): ``predict_proba`` is their softmax, not a
Gaussian posterior.

:class:`RanPACClassifier`, :class:`ACILClassifier` and :class:`RBFLDAClassifier` wrap a
:class:`~gdacil.heads.MappedLinearHead`: the head maps the raw features through a seeded random
map of dimension ``M`` (``dim_out``, ``buffer_size``) and keeps pooled statistics of the MAPPED
features (:class:`~gdacil.stats.PooledGaussians`: class counts and means and one pooled
``M x M`` scatter). There is no per-class Gaussian: ``stats_`` is the head's pooled statistics
(the same object as ``head_.stats_``). Fitting in shards gives the model of one ``fit`` up to
round-off, except where a setting is chosen from the data: ``bandwidth="auto"`` (RBF-LDA) from
the first batch, ``lam="auto"`` (RanPAC) from EVERY batch (an 80/20 holdout split of that batch;
each ``partial_fit`` then needs at least 2 samples, and the penalty in use is the last batch's).
Scores:

- RanPAC, ACIL: the outputs ``h^T W`` of a ridge regression on one-hot targets (1 for a sample's
  class, 0 for the others), not log-posteriors; ``predict_proba`` is their softmax, a monotone
  squashing that keeps the ranking, not a calibrated probability.
- RBF-LDA: LDA log-posteriors in the mapped space up to a per-sample constant; ``predict_proba``
  is the LDA posterior.

The head's solve is lazy, but every ``partial_fit`` of these estimators solves (``M^3 / 3``
flops), so that a solve that fails does so inside ``partial_fit``. The defaults (``M`` = 10000,
8192, 5000) make the statistics 0.2 to 0.8 GB; use a few hundred for small problems.

Labels and outputs
------------------
Labels may be of any type scikit-learn accepts (ints, floats with integral values, strings,
objects). ``classes_`` is sorted like scikit-learn's; ``predict`` returns original labels;
``predict_proba``, ``predict_log_proba`` and ``decision_function`` have their columns in
``classes_`` order. ``predict_proba`` is the softmax of the scores. The Gaussian heads' scores are
log-posteriors up to a per-sample constant (for the anchor heads see above). For two classes
``decision_function`` returns ``score(classes_[1]) - score(classes_[0])`` (1-D, positive means
``classes_[1]``; the log-odds where the scores are log-posteriors), as scikit-learn's convention
asks. ``fit`` needs at least two classes, as scikit-learn's does; ``partial_fit`` accepts a first
batch of one class (classes arrive over time), and until a second arrives it predicts that class
everywhere (its ``decision_function`` has one column).

Priors (every estimator but RanPAC and ACIL, which have none) default to uniform (the paper's
choice; scikit-learn's LDA/QDA default to the empirical frequencies: pass ``priors="empirical"``
for that). An array of priors is in ``classes_`` order and must match the number of classes; a
mapping is keyed by the original labels and may name classes that ``partial_fit`` has yet to see
(only the priors of the classes seen so far are used, renormalised). Priors (all the array's, or
all the mapping's entries) that do not sum to 1 are renormalised with a ``UserWarning``, as
scikit-learn does.

Numerics and scale
------------------
Statistics are accumulated in float64 on the CPU. The head is built in float64 and scores in
``dtype`` (default ``"float64"``) on ``device`` (default CPU): ``device="cuda",
dtype="float32"`` builds and scores on a GPU. The mapped heads run on the CPU (no ``device``) and
take ``dtype`` ``"float64"`` or ``"float32"``. Outputs are numpy arrays either way. The class
covariances use ``1/n`` (as scikit-learn >= 1.8's QDA does). The identity terms of RGDA and
LR-RGDA (``alpha3``) are measured in units of ``tr(Sigma_avg) / (N - C)``, the mean
per-dimension within-class variance times ``d / (N - C)`` for ``N`` samples of ``C`` classes,
and LDA's shrinkage target in units of ``tr(Sigma_avg) / d``, so predictions are the same
whatever the units of the features (raw, LayerNorm or L2-normalised embeddings).
``identity_scale="absolute"`` (RGDA, LR-RGDA) and ``shrinkage_target="identity"`` (LDA) give the
paper's absolute forms, which assume features of scale about 1. QDA's ``reg_param`` is absolute,
as in scikit-learn.

A class with a single sample has a zero covariance. RGDA and LR-RGDA regularise it (with
``alpha2 Sigma_avg + alpha3 I``), as do LDA (through the shared, shrunk covariance) and NCM (which
uses no covariance). QDA with ``reg_param=0`` (and RGDA with ``alpha2 = alpha3 = 0``) cannot: the
estimator raises a ``ValueError`` naming the class before touching its state. Classes with fewer
samples than features have singular covariances: the head adds the smallest jitter that factors
them and emits a ``gdacil.stats.linalg.NumericalWarning``. (A class whose samples are all identical
also has a zero covariance, which unregularised QDA turns into a near point mass: use
``reg_param > 0`` when that can happen.)

Forgetting
----------
``forget(classes)`` takes classes out of ``stats_`` and rebuilds ``head_`` without them: the
estimator then predicts as one fitted on the samples of the other classes only, to round-off,
with ``classes_`` shorter, and neither its head nor its statistics hold anything of the classes.
The per-class statistics simply lose their rows; the mapped heads pool every class's scatter into
one matrix, so they forget only when built with ``forgettable=True``, which keeps each class's
scatter as well (see :class:`~gdacil.heads.MappedLinearHead`) and needs ``lam`` and ``bandwidth``
numeric (a value chosen from samples cannot be un-chosen). A label not in ``classes_``, priors
given as an array (they would no longer match the classes) and a mapped head that is not
forgettable raise a ``ValueError`` and change nothing; forgetting every class leaves the
estimator unfitted. If rebuilding the head fails, the statistics have lost the classes already:
the estimator is then unfitted until the next ``partial_fit`` rebuilds it from them. LR-RGDA
with ``decomposition="randomized"`` seeds each class by its internal id, which a fit that never
saw the classes may number otherwise (see above).

Errors
------
Input is validated by scikit-learn's ``validate_data``: NaN or inf, a wrong number of dimensions
or features, empty input, and continuous targets raise ``ValueError``, and so do integer features
beyond ``2**53`` (float64 would round them: two different inputs could become one), naming the
sample and the feature; using an estimator before
``fit`` raises ``sklearn.exceptions.NotFittedError``. Parameters and class counts are checked
before anything changes: a ``partial_fit`` that fails these checks leaves the estimator as it was
(``fit`` starts from scratch, so a failed ``fit`` leaves it unfitted). Building or solving the
head is the only step that can fail after the batch has joined the statistics (a matrix that
cannot be factorised even with jitter, values that overflow); the call then raises and undoes
itself: statistics, head and predictions are exactly as before it. The per-class statistics save
the rows of the batch's classes for that; the pooled statistics of the mapped heads keep a copy of
their ``M x M`` scatter during the call (updated in place, a float64 sum cannot be undone
exactly), ``8 M^2`` bytes more at the peak (0.8 GB at ``M = 10000``).

scikit-learn compatibility
--------------------------
Skipped ``check_estimator`` checks: none. ``tests/estimators/test_sklearn.py`` and
``tests/estimators/test_sklearn_anchors.py`` (the anchor heads, with small maps) run every check
through ``parametrize_with_checks``. scikit-learn itself skips
``check_classifier_data_not_an_array`` when pandas is not installed and ``check_array_api_input``
unless ``SCIPY_ARRAY_API=1`` is set; both pass when those are present. See ``docs/sklearn.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._deprecation import renamed_parameters
from ._params import parameter_names
from ._validation import as_dtype, check_exact_integers
from .heads import ACIL, LDA, LRRGDA, NCM, QDA, RBFLDA, RGDA, FeCAM, RanPAC
from .heads.base import warn_unless_normalised
from .heads.ridge import RidgeHead
from .stats import ClassGaussians

__all__ = [
    "ACILClassifier",
    "FeCAMClassifier",
    "LDAClassifier",
    "LRRGDAClassifier",
    "NCMClassifier",
    "QDAClassifier",
    "RBFLDAClassifier",
    "RGDAClassifier",
    "RanPACClassifier",
]

_FLOAT_DTYPES = (np.float64, np.float32)
_FITTED_STATE = ("stats_", "head_", "classes_", "_class_ids", "_columns", "_labels_by_id")

# Documentation of the parameters several estimators share, in the order of each signature
_PARAMETER_DOCS = {
    "priors": """\
    priors : None, "empirical", array-like of shape (n_classes,) or mapping, default None
        Class priors. None means uniform (the paper's choice); "empirical" uses the class
        frequencies; an array is in ``classes_`` order; a mapping is keyed by class label
        (and, unlike an array, can cover classes that ``partial_fit`` has not seen yet).""",
    "device": """\
    device : None, str or torch.device, default None
        Where the head is built and scores are computed (None: the CPU).""",
    "dtype": """\
    dtype : str or torch.dtype, default "float64"
        Dtype of the head's inference tensors: "float64", "float32", "float16" or "bfloat16" (the
        mapped heads take the first two only), or the ``torch.dtype``. Statistics are always
        accumulated, and mapped heads solved, in float64.""",
    "class_batch_size": """\
    class_batch_size : int or "auto", default "auto"
        Classes per block when building and scoring; "auto" keeps the score buffer near 8 MiB.""",
    "max_bytes": """\
    max_bytes : int or None, default 16 GiB
        Largest state (statistics plus the work space of a build or solve) the head accepts;
        larger configurations are refused with a ``ValueError`` before memory is allocated.
        None disables the check.""",
    "forgettable": """\
    forgettable : bool, default False
        Keep each class's scatter besides the pooled one, so that :meth:`forget` can take a
        class out exactly (up to ``8 M^2`` bytes more per class: see the head). Needs the
        data-chosen settings numeric (``lam``, ``bandwidth``); fixed by the first batch.""",
}

_SHARED_ATTRIBUTES = """\
    classes_ : ndarray of shape (n_classes,)
        Class labels seen so far, sorted.
    n_features_in_ : int
        Number of features seen during ``fit``.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of the features seen during ``fit``; defined only when ``X`` had string column
        names."""

_GAUSSIAN_STATE = """\
    stats_ : ClassGaussians
        Accumulated per-class statistics (internal integer class ids, in order of first
        appearance).
    head_ : GaussianHead
        The head built from ``stats_``; one object for the estimator's whole life between two
        ``fit`` calls."""

_MAPPED_STATE = """\
    stats_ : PooledGaussians
        The head's statistics of the mapped features (the same object as ``head_.stats_``):
        class counts and means and one pooled scatter, internal integer class ids in order of
        first appearance. There are no per-class covariances.
    head_ : MappedLinearHead
        The head, solved after every ``partial_fit``; its ``feature_map_`` is fixed by the first
        batch; one object for the estimator's whole life between two ``fit`` calls."""


def _init_like(head_class: type[Any], owner: str) -> Callable[..., None]:
    """An estimator's ``__init__``: ``head_class``'s signature, storing every argument under its
    own name (what ``get_params``, ``clone`` and ``check_estimator`` ask of an ``__init__``).

    The head's deprecated aliases (``random_state`` for ``seed``) are accepted as the head
    accepts them, with a ``FutureWarning`` naming ``owner``.
    """
    signature = inspect.signature(head_class.__init__)
    names = parameter_names(head_class)

    def __init__(self, *args, **kwargs):
        try:
            arguments = signature.bind(self, *args, **kwargs).arguments
        except TypeError as err:
            raise TypeError(f"{owner}() {err}") from None
        for name in names:
            setattr(self, name, arguments.get(name, signature.parameters[name].default))

    __init__.__qualname__ = f"{owner}.__init__"
    __init__.__signature__ = signature  # type: ignore[attr-defined]  # what get_params reads
    # inspect.getsource (and so Sphinx's autodoc_preserve_defaults) shows the head's definition
    __init__.__wrapped__ = head_class.__init__  # type: ignore[attr-defined]
    __init__.__doc__ = f"Store the parameters (:class:`~gdacil.heads.{head_class.__name__}`'s)."
    renames = getattr(head_class.__init__, "__renamed_parameters__", {})
    return renamed_parameters(**renames)(__init__) if renames else __init__


def _fill_docstring(cls) -> None:
    """Complete an estimator's docstring: the documentation of the shared parameters it takes
    (at ``{shared_parameters}``) and its Attributes section (before Examples)."""
    names = parameter_names(cls)
    shared = "\n".join(_PARAMETER_DOCS[name] for name in names if name in _PARAMETER_DOCS)
    attributes = f"    Attributes\n    ----------\n{_SHARED_ATTRIBUTES}\n{cls._STATE_DOC}\n\n"
    cls.__doc__ = (cls.__doc__.replace("    {shared_parameters}", shared)
                   .replace("    Examples\n", f"{attributes}    Examples\n", 1))


def _validated(estimator, X, y="no_validation", *, reset: bool):
    """``validate_data`` of ``X`` (and ``y``, when given) as float64 or float32, refusing
    integer features that float64 would round (:func:`gdacil._validation.check_exact_integers`)
    where scikit-learn would convert them silently."""
    out = validate_data(estimator, X, y, reset=reset, dtype="numeric")
    features = out[0] if isinstance(out, tuple) else out
    if features.dtype not in _FLOAT_DTYPES:
        check_exact_integers(features, "X")
        features = features.astype(np.float64)
    return (features, out[1]) if isinstance(out, tuple) else features


def _as_tensor(X: np.ndarray) -> torch.Tensor:
    # torch cannot wrap read-only arrays (e.g. memory maps) without a copy.
    return torch.from_numpy(X if X.flags.writeable else X.copy())


def _is_numeric(labels: np.ndarray) -> bool:
    return labels.dtype.kind in "biuf"


def _same(a, b) -> bool:
    """Whether two parameter values are equal (values whose ``==`` is not one bool differ)."""
    try:
        return a is b or bool(a == b)
    except (TypeError, ValueError):
        return False


@contextmanager
def _restore_on_error(head, params: dict):
    """Set ``params`` on ``head``; if the ``with`` block raises, give ``head`` back its attributes.

    Heads replace their fitted state by assignment, never by writing into it, except for lists
    they append to (RanPAC's ``lam_history_``), which are copied here. Statistics updated in place
    are undone by their own rollback (:meth:`~gdacil.ClassStatistics.rollback_on_error`,
    :func:`_pooled_rollback`).
    """
    saved = {name: list(value) if isinstance(value, list) else value
             for name, value in vars(head).items()}
    try:
        yield head.set_params(**params)
    except BaseException:
        vars(head).clear()
        vars(head).update(saved)
        raise


@contextmanager
def _pooled_rollback(stats):
    """Undo the ``with`` block's changes to the ``PooledGaussians`` ``stats`` if it raises.

    The pooled scatter is updated in place (``addmm_``) and a float64 sum cannot be undone
    exactly, so this keeps a copy: the ``M x M`` scatter and the ``C x M`` means, restored into the
    same object (so ``stats_`` and ``head_.stats_`` stay one). ``None``: nothing to save.
    """
    saved = None if stats is None else stats.copy()
    try:
        yield
    except BaseException:
        if saved is not None:
            vars(stats).update(vars(saved))
        raise


def _update_and_rebuild(stats: ClassGaussians, head, params: dict, X: torch.Tensor,
                        y_ids: torch.Tensor) -> None:
    """Add the batch to ``stats`` and refit ``head`` with ``params``, or change neither.

    If anything fails (a head that cannot be built from the merged statistics, an interrupt),
    ``stats`` gets back the rows of the batch's classes and ``head`` its attributes.
    """
    with _restore_on_error(head, params), stats.rollback_on_error(torch.unique(y_ids).tolist()):
        stats.update(X, y_ids)
        head.fit(stats)
        if isinstance(head, FeCAM):  # it builds lazily: build now, so failures surface here
            head.build()


def _update_and_solve(head, params: dict, X: torch.Tensor, y_ids: torch.Tensor) -> None:
    """Fold the batch into a mapped head's pooled statistics and solve with ``params``, or change
    nothing (statistics, fitted scalars, weights)."""
    with _restore_on_error(head, params), _pooled_rollback(getattr(head, "stats_", None)):
        if isinstance(head, RidgeHead) and hasattr(head, "stats_") and head._penalty() is not None:
            head.lam_ = head._penalty()  # the head reads a fixed penalty at its first batch only
        head.partial_fit(X, y_ids)
        head.solve()


class _GaussianClassifier(ClassifierMixin, BaseEstimator):
    """Shared machinery: label encoding, statistics, head (re)building, outputs.

    A concrete subclass names its head (``_head_class``) and gets its ``__init__`` from it: the
    head's signature, every argument stored (:func:`_init_like`), so a parameter is declared
    once, in the head. It may override ``_apply_batch`` (how a batch reaches the statistics and
    the head), ``_new_stats``, ``_check_class_counts`` and ``_fixed_params`` (parameters the
    statistics depend on).
    """

    _head_class: type[Any] = None  # type: ignore[assignment]  # every concrete subclass sets it
    #: Parameters the statistics depend on (a feature map, a transform): fixed by the first batch
    _fixed_params: tuple[str, ...] = ()
    _STATE_DOC = _GAUSSIAN_STATE
    stats_: ClassGaussians  # fitted (set by the first batch)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_head_class" in vars(cls):  # a concrete estimator: the head's parameters
            init = _init_like(cls._head_class, cls.__qualname__)
            cls.__init__ = init  # type: ignore[method-assign]
            _fill_docstring(cls)

    # ---------------------------------------------------------------- fitting
    def fit(self, X, y):
        """Fit the classifier on ``X``, ``y`` from scratch.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)

        Returns
        -------
        self
        """
        return self._fit(X, y, reset=True, min_classes=2)

    def partial_fit(self, X, y, classes=None):
        """Add a batch of samples; labels never seen before become new classes.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like, optional
            Accepted for compatibility with scikit-learn's incremental API, never needed. When
            given, every label of ``y`` must be one of them.

        Returns
        -------
        self
        """
        return self._fit(X, y, reset=not hasattr(self, "stats_"), classes=classes)

    def _fit(self, X, y, *, reset, classes=None, min_classes=1):
        if reset:  # fit starts from scratch: a failed fit leaves the estimator unfitted
            for name in _FITTED_STATE:
                self.__dict__.pop(name, None)
        X, y = _validated(self, X, y, reset=reset)
        check_classification_targets(y)
        if classes is not None:
            unlisted = np.setdiff1d(y, np.asarray(classes))
            if unlisted.size:
                raise ValueError(f"y has labels {unlisted[:10].tolist()} that are not in classes")
        labels, class_ids, y_ids = self._encode(y, reset=reset)
        if labels.size < min_classes:
            raise ValueError(f"The number of classes has to be greater than one; got "
                             f"{labels.size} class ({labels[:1].tolist()}); partial_fit accepts "
                             "one class at a time")
        counts = np.bincount(y_ids, minlength=int(class_ids.max()) + 1).astype(np.float64)
        if not reset:
            counts[self.stats_.classes] += self.stats_.counts.cpu().numpy()
        self._check_class_counts(labels, counts[class_ids])
        kwargs = self._head_kwargs(labels, class_ids)
        self._head_class(**kwargs)._check_params()
        if not reset:
            self._check_fixed_params()

        stats, head = self._apply_batch(_as_tensor(X), torch.from_numpy(y_ids), kwargs, reset=reset)
        self.stats_, self.head_ = stats, head
        self._set_classes(labels, class_ids)
        return self

    def _set_classes(self, labels: np.ndarray, class_ids: np.ndarray) -> None:
        """``classes_`` and the maps between labels, internal ids and the head's columns."""
        self.classes_, self._class_ids = labels, class_ids
        self._columns = self.stats_.positions(class_ids.tolist())
        self._labels_by_id = np.empty(int(class_ids.max()) + 1, dtype=labels.dtype)
        self._labels_by_id[class_ids] = labels

    # ------------------------------------------------------------- forgetting
    def forget(self, classes):
        """Forget classes: take them out of the statistics and rebuild the head without them.

        The estimator then predicts as one fitted on the samples of the other classes only,
        to round-off (see "Forgetting" in :mod:`gdacil.sklearn`), and its head and statistics
        hold nothing of the classes. Forgetting every class leaves it unfitted.

        Parameters
        ----------
        classes : label or array-like of labels
            Labels of ``classes_``.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before anything changes: a label not in ``classes_`` (named); ``priors`` given as
            an array, which would no longer match the classes (give a mapping); RanPAC, ACIL
            or RBF-LDA not built with ``forgettable=True``.

        Examples
        --------
        >>> import numpy as np
        >>> from gdacil.sklearn import LDAClassifier
        >>> rng = np.random.default_rng(0)
        >>> X, y = rng.normal(size=(90, 3)), np.repeat(["cat", "dog", "owl"], 30)
        >>> clf = LDAClassifier().fit(X, y).forget("dog")
        >>> clf.classes_, sorted(set(clf.predict(X).tolist()))
        (array(['cat', 'owl'], dtype='<U3'), ['cat', 'owl'])
        """
        check_is_fitted(self)
        gone = np.asarray(classes).reshape(-1)
        unknown = gone[~np.isin(gone, self.classes_)]
        if unknown.size:
            raise ValueError(f"{type(self).__name__}.forget: unknown class "
                             f"{unknown.tolist()[0]!r}; the classes are "
                             f"{self.classes_[:20].tolist()}")
        keep = ~np.isin(self.classes_, gone)
        labels, class_ids = self.classes_[keep], self._class_ids[keep]
        kwargs = self._head_kwargs(labels, class_ids) if labels.size else None
        try:
            self._forget_ids(self._class_ids[~keep].tolist(), kwargs)
        except BaseException:
            if labels.size and len(self.stats_) != self.classes_.size:  # they are gone already
                self._set_classes(labels, class_ids)
                del self._columns  # unfitted until a partial_fit rebuilds the head
            raise
        if labels.size:
            self._set_classes(labels, class_ids)
        else:
            for name in (*_FITTED_STATE, "n_features_in_", "feature_names_in_"):
                self.__dict__.pop(name, None)
        return self

    def _forget_ids(self, ids: list[int], kwargs: dict | None) -> None:
        """Forget the classes of internal ids ``ids`` in the statistics and the head, whose
        parameters become ``kwargs`` (None: every class goes)."""
        if kwargs is not None:
            self.head_.set_params(**kwargs)
        self.head_.forget(ids, self.stats_)

    def _apply_batch(self, X: torch.Tensor, y_ids: torch.Tensor, kwargs: dict, *, reset: bool):
        """Fold the batch into the statistics and rebuild the head with ``kwargs``, or change
        nothing; returns ``(stats, head)`` (new ones when ``reset``)."""
        if reset:
            stats, head = self._new_stats(X.shape[1]), self._head_class(**kwargs)
        else:
            stats, head = self.stats_, self.head_
        _update_and_rebuild(stats, head, kwargs, X, y_ids)
        return stats, head

    def _new_stats(self, n_features: int) -> ClassGaussians:
        return ClassGaussians(n_features)

    def _check_fixed_params(self) -> None:
        """Refuse a change, since the first batch, of a parameter the statistics depend on."""
        for name in self._fixed_params:
            used, now = getattr(self.head_, name), getattr(self, name)
            if not _same(used, now):
                raise ValueError(
                    f"{type(self).__name__}: {name} changed from {used!r} to {now!r} since the "
                    f"first batch, but the statistics were computed with {name}={used!r}; call "
                    "fit to start afresh with the new value")

    def __sklearn_is_fitted__(self) -> bool:
        return getattr(self, "_columns", None) is not None

    def _encode(self, y: np.ndarray, *, reset: bool):
        """Sorted labels, their internal ids, and the ids of ``y``; changes no state.

        Internal ids number the classes in order of first appearance, so the statistics (and
        the head's caches) of known classes keep their ids when new classes arrive.
        """
        seen, inverse = np.unique(y, return_inverse=True)
        labels = seen
        if reset:
            class_ids = np.arange(labels.size)
        else:
            known = self.classes_
            if _is_numeric(known) != _is_numeric(seen):
                raise ValueError(f"labels of type {seen.dtype} cannot join the classes seen so "
                                 f"far, of type {known.dtype}: {known[:10].tolist()}")
            fresh = seen[~np.isin(seen, known)]
            labels = np.concatenate([known, fresh])
            first = int(self._class_ids.max()) + 1  # ids of forgotten classes may be missing
            class_ids = np.concatenate([self._class_ids, first + np.arange(fresh.size)])
            order = np.argsort(labels, kind="stable")
            labels, class_ids = labels[order], class_ids[order]
        y_ids = class_ids[np.searchsorted(labels, seen)][inverse]
        return labels, class_ids, y_ids.astype(np.int64)

    def _check_class_counts(self, labels: np.ndarray, counts: np.ndarray) -> None:
        """Raise if a class has too few samples for this model (``counts`` in ``labels`` order)."""
        if self._needs_class_covariance():
            single = labels[counts < 2].tolist()
            if single:
                raise ValueError(
                    f"{type(self).__name__}: class {single[0]!r} has only 1 sample, so its "
                    "covariance is zero and this unregularised model is undefined; add "
                    "regularisation (reg_param > 0, or alpha2/alpha3 > 0) or more samples")

    def _needs_class_covariance(self) -> bool:
        """Whether a zero class covariance makes the model undefined (no regularisation)."""
        return False

    def _head_kwargs(self, labels: np.ndarray, class_ids: np.ndarray) -> dict:
        kwargs = {name: getattr(self, name) for name in parameter_names(self._head_class)}
        # LRRGDA computes with its dtype itself: every head gets the torch.dtype
        kwargs["dtype"] = as_dtype(self.dtype)
        if "priors" in kwargs:
            kwargs["priors"] = self._internal_priors(labels, class_ids)
        return kwargs

    def _internal_priors(self, labels: np.ndarray, class_ids: np.ndarray):
        """``priors`` as the head takes them: keyed by internal class id."""
        priors = self.priors
        if priors is None or isinstance(priors, str):
            return priors
        if isinstance(priors, Mapping):
            missing = [c for c in labels.tolist() if c not in priors]
            if missing:
                raise ValueError(f"priors has no entry for classes {missing[:10]}")
            values = np.array([priors[c] for c in labels.tolist()], dtype=np.float64)
        else:
            values = np.asarray(priors, dtype=np.float64).reshape(-1)
            if values.size != labels.size:
                raise ValueError(f"priors has {values.size} entries but there are {labels.size} "
                                 f"classes {labels[:10].tolist()}; while partial_fit adds "
                                 "classes, give priors as a mapping label -> prior")
        if not np.isfinite(values).all() or (values <= 0).any():
            raise ValueError(f"priors must be positive and finite; got {values[:10].tolist()}")
        warn_unless_normalised(sum(priors.values()) if isinstance(priors, Mapping)
                               else values.sum())
        # normalised over the classes seen so far: the head has nothing left to warn about
        return dict(zip(class_ids.tolist(), (values / values.sum()).tolist()))

    # ------------------------------------------------------------- prediction
    def _validate_for_prediction(self, X) -> torch.Tensor:
        check_is_fitted(self)
        return _as_tensor(_validated(self, X, reset=False))

    def _head_output(self, method: str, X, then=None) -> np.ndarray:
        """The head's ``method`` on ``X`` (then ``then`` of it), columns in ``classes_`` order."""
        X = self._validate_for_prediction(X)
        out = getattr(self.head_, method)(X)
        if then is not None:
            out = then(out)
        return out[:, self._columns.to(out.device)].cpu().numpy()

    def predict(self, X):
        """Predicted class labels, shape ``(n_samples,)``, of the type of ``classes_``."""
        X = self._validate_for_prediction(X)
        return self._labels_by_id[self.head_.predict(X).numpy()]

    def decision_function(self, X):
        """Class scores: log-posteriors up to a per-sample constant for the Gaussian heads and
        RBF-LDA; ridge outputs (targets 0/1) for RanPAC and ACIL; minus half the squared
        Mahalanobis distance plus the log-prior for FeCAM.

        Returns
        -------
        ndarray of shape (n_samples, n_classes), columns in ``classes_`` order; for two classes,
        shape (n_samples,): ``score(classes_[1]) - score(classes_[0])`` (the log-odds where the
        scores are log-posteriors; positive means ``classes_[1]``).
        """
        scores = self._head_output("decision_function", X)
        if scores.shape[1] == 2:
            return scores[:, 1] - scores[:, 0]
        return scores

    def predict_proba(self, X):
        """Softmax of the scores, shape ``(n_samples, n_classes)``, ``classes_`` order: the
        posterior class probabilities where the scores are log-posteriors (see
        :meth:`decision_function`)."""
        return self._head_output("predict_proba", X)

    def score_samples(self, X, method=None):
        """Novelty scores, shape ``(n_samples,)``: higher means more typical of the classes
        learned so far (as scikit-learn's novelty detectors score). ``method`` names one of
        :data:`gdacil.novelty.NOVELTY_SCORES` (the default: the head's ``default_novelty``,
        ``"relative_likelihood"`` for LR-RGDA and RGDA, ``"shrunk_relative_mahalanobis"`` for
        the other Gaussian heads; RanPAC, ACIL and RBF-LDA offer ``"msp"``, their default, and
        ``"energy"``). See :mod:`gdacil.novelty`.

        Examples
        --------
        >>> import numpy as np
        >>> from gdacil.sklearn import LDAClassifier
        >>> rng = np.random.default_rng(0)
        >>> y = np.repeat(["cat", "dog"], 100)
        >>> X = rng.normal(size=(200, 4)) + 3.0 * np.eye(2, 4)[np.repeat([0, 1], 100)]
        >>> clf = LDAClassifier().fit(X, y)
        >>> typical, odd = clf.score_samples(np.array([[3.0, 0, 0, 0], [0, 0, 9.0, 9.0]]))
        >>> bool(typical > odd)
        True
        """
        X = self._validate_for_prediction(X)
        return self.head_.score_samples(X, method).cpu().numpy()

    def predict_log_proba(self, X):
        """Log of :meth:`predict_proba`, computed stably (log-softmax of the scores)."""
        return self._head_output("decision_function", X,
                                 then=lambda scores: torch.log_softmax(scores, dim=1))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False       # NaN/inf are rejected
        tags.input_tags.sparse = False          # dense features only
        tags.classifier_tags.multi_class = True
        tags.classifier_tags.multi_label = False
        tags.target_tags.multi_output = False
        tags.non_deterministic = False          # seeded decompositions, deterministic on CPU
        tags.array_api_support = False          # numpy in, numpy out
        return tags


class NCMClassifier(_GaussianClassifier):
    """Nearest-class-mean classifier (:class:`gdacil.heads.NCM`).

    Parameters
    ----------
    metric : {"euclidean", "cosine"}, default "euclidean"
        Euclidean scores are ``-1/2 ||x - mu_c||^2 + log pi_c``; cosine scores are
        ``cos(x, mu_c) + log pi_c``.
    {shared_parameters}

    Examples
    --------
    >>> from gdacil.sklearn import NCMClassifier
    >>> X = [[0.0, 0.1], [0.2, 0.0], [5.0, 5.1], [5.2, 4.9]]
    >>> clf = NCMClassifier().fit(X, ["a", "a", "b", "b"])
    >>> clf.predict([[4.0, 4.5], [0.5, 0.0]])
    array(['b', 'a'], dtype='<U1')
    """

    _head_class = NCM


class LDAClassifier(_GaussianClassifier):
    """Linear discriminant analysis with a shrunk shared covariance (:class:`gdacil.heads.LDA`).

    The shared covariance is ``(1 - shrinkage) Sigma_avg + shrinkage * t * I`` where
    ``Sigma_avg`` is the unweighted mean of the class covariances and ``t = 1`` (identity target)
    or ``t = tr(Sigma_avg) / d`` (``"scaled_identity"``: scikit-learn's
    ``LinearDiscriminantAnalysis(solver="lsqr", shrinkage=shrinkage)`` on balanced classes).

    Parameters
    ----------
    shrinkage : float in [0, 1], default 0.1
    shrinkage_target : {"scaled_identity", "identity"}, default "scaled_identity"
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from gdacil.sklearn import LDAClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(size=(50, 3)), rng.normal(size=(50, 3)) + 4.0])
    >>> y = np.repeat([10, 20], 50)
    >>> clf = LDAClassifier(shrinkage=0.2).fit(X, y)
    >>> clf.classes_, clf.score(X, y)
    (array([10, 20]), 1.0)
    >>> clf.decision_function([[3.0, 3.0, 3.0]]) > 0   # positive: classes_[1]
    array([ True])
    """

    _head_class = LDA

    def _check_class_counts(self, labels: np.ndarray, counts: np.ndarray) -> None:
        if counts.sum() <= labels.size:  # one sample per class: no within-class scatter at all
            raise ValueError(f"The number of samples must be more than the number of classes; "
                             f"got {int(counts.sum())} samples of {labels.size} classes")
        super()._check_class_counts(labels, counts)


class QDAClassifier(_GaussianClassifier):
    """Quadratic discriminant analysis (:class:`gdacil.heads.QDA`).

    Class covariances are ``(1 - reg_param) Sigma_c + reg_param I`` with ``1/n`` estimates, as in
    scikit-learn >= 1.8's ``QuadraticDiscriminantAnalysis(reg_param=...)``. With
    ``reg_param=0`` every class needs at least 2 samples.

    Parameters
    ----------
    reg_param : float in [0, 1], default 0.0
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from gdacil.sklearn import QDAClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(size=(100, 2)), 4.0 * rng.normal(size=(100, 2))])
    >>> y = np.repeat(["narrow", "wide"], 100)
    >>> clf = QDAClassifier(reg_param=0.01).fit(X, y)
    >>> clf.predict([[0.1, -0.2], [6.0, 5.0]])
    array(['narrow', 'wide'], dtype='<U6')
    >>> clf.predict_proba([[6.0, 5.0]]).round(3)
    array([[0., 1.]])
    """

    _head_class = QDA

    def _needs_class_covariance(self) -> bool:
        return self.reg_param == 0


class RGDAClassifier(_GaussianClassifier):
    """Regularised Gaussian discriminant analysis (:class:`gdacil.heads.RGDA`).

    Class covariances are ``alpha1 Sigma_c + alpha2 Sigma_avg + alpha3 u I`` with
    ``u = tr(Sigma_avg) / (N - C)`` for ``N`` samples of ``C`` classes
    (``identity_scale="samples"``), ``u = tr(Sigma_avg) / d`` (``"trace"``) or ``u = 1``
    (``"absolute"``, the paper's; see the module notes).

    Parameters
    ----------
    alpha1, alpha2, alpha3 : float >= 0, default (0.1, 2.0, 0.6)
        gdacil's defaults; the paper's are (0.2, 2.0, 0.5) with ``identity_scale="absolute"``.
    identity_scale : {"samples", "trace", "absolute"}, default "samples"
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from gdacil.sklearn import RGDAClassifier
    >>> rng = np.random.default_rng(0)
    >>> y = np.arange(300) % 3
    >>> X = rng.normal(size=(300, 4)) + 3.0 * np.eye(3, 4)[y]   # class c shifted along axis c
    >>> clf = RGDAClassifier().fit(X, y)
    >>> clf.predict_proba(X[:4]).shape, clf.score(X, y) > 0.9
    ((4, 3), True)
    """

    _head_class = RGDA

    def _needs_class_covariance(self) -> bool:
        return self.alpha2 == 0 and self.alpha3 == 0


class LRRGDAClassifier(_GaussianClassifier):
    """Low-rank regularised Gaussian discriminant analysis, the paper's LR-RGDA
    (:class:`gdacil.heads.LRRGDA`).

    Each class covariance is the shared base ``alpha2 Sigma_avg + alpha3 u I`` plus ``alpha1`` times
    the class covariance's top-``rank`` eigenpairs. ``partial_fit`` re-decomposes only new or
    changed classes (``head_.n_decomposed_``).

    Parameters
    ----------
    rank : int, default 64
        Rank of each class's covariance perturbation (``rank >= n_features`` is full RGDA).
    alpha1, alpha2, alpha3 : float >= 0, default (0.1, 2.0, 0.6)
        gdacil's defaults; the paper's are (0.2, 2.0, 0.5) with ``identity_scale="absolute"``.
    identity_scale : {"samples", "trace", "absolute"}, default "samples"
        The unit ``u`` of the identity term: ``tr(Sigma_avg) / (N - C)`` for ``N`` samples of
        ``C`` classes, ``tr(Sigma_avg) / d``, or 1 (the paper's form, which assumes features of
        scale about 1).
    decomposition : {"eigh", "randomized"}, default "eigh"
    oversample : int, default 16
    n_iter : int, default 4
    seed : int, default 0
        Seed of the randomized decomposition (per class, independent of class order): every
        random choice takes this seed. The former name ``random_state`` is a deprecated alias.
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from gdacil.sklearn import LRRGDAClassifier
    >>> rng = np.random.default_rng(0)
    >>> def task(label, center):
    ...     return rng.normal(size=(50, 4)) + center, [label] * 50
    >>> clf = LRRGDAClassifier(rank=2)
    >>> clf = clf.partial_fit(*task("cat", [0, 0, 0, 0]))
    >>> clf = clf.partial_fit(*task("dog", [3, 0, 0, 0]))
    >>> clf = clf.partial_fit(*task("owl", [0, 3, 0, 0]))    # a class never seen before
    >>> clf.classes_
    array(['cat', 'dog', 'owl'], dtype='<U3')
    >>> clf.predict([[0.1, 2.9, 0.0, 0.0], [2.8, 0.2, 0.1, 0.0]])
    array(['owl', 'dog'], dtype='<U3')
    >>> clf.head_.n_decomposed_    # only the new class was decomposed in the last call
    1
    """

    _head_class = LRRGDA


class FeCAMClassifier(_GaussianClassifier):
    """FeCAM's per-class Mahalanobis classifier (:class:`gdacil.heads.FeCAM`).

    Samples are transformed first (the signed Tukey power ``sign(x) |x|^tukey``, then L2
    normalisation if ``l2``; :meth:`gdacil.heads.FeCAM.transform`), and ``stats_`` holds the
    per-class statistics of the TRANSFORMED features (what :meth:`gdacil.heads.FeCAM.fit_stats`
    takes); the head transforms the samples it scores itself. Class ``c`` scores
    ``-1/2 (x - mu_c)^T R_c^{-1} (x - mu_c) + log pi_c`` with ``R_c`` the shrunk (``alpha1``,
    ``alpha2``) and, if ``normalize``, correlation-normalised covariance: no log-determinant, so
    ``predict_proba`` is a softmax of distances, not a Gaussian posterior. ``tukey``, ``l2`` and
    ``ddof`` define the statistics and are fixed by the first batch (change them with ``fit``).
    The published settings are ``gdacil.heads.fecam.FECAM_PRESETS`` (e.g.
    ``FeCAMClassifier(**FECAM_PRESETS["vit"])``).

    Parameters
    ----------
    alpha1, alpha2 : float >= 0, default (1.0, 0.0)
        Shrinkage towards the mean diagonal and the mean off-diagonal entry of each covariance.
    tukey : float > 0 or None, default None
        Tukey power (None: no transform).
    normalize : bool, default True
        Correlation normalisation of the shrunk covariances.
    l2 : bool, default False
        L2-normalise each sample (after Tukey).
    rcond : float in [0, 1), default 1e-10
        Eigenvalues of ``R_c`` below ``rcond`` times its largest are treated as zero.
    ddof : {0, 1}, default 1
        Covariance normalisation ``1 / (n - ddof)`` (irrelevant when ``normalize``).
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from gdacil.sklearn import FeCAMClassifier
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(["a", "b", "c"], 40)
    >>> X = rng.normal(size=(120, 5)) + 3.0 * np.eye(3, 5)[np.searchsorted(["a", "b", "c"], y)]
    >>> clf = FeCAMClassifier(tukey=0.5).partial_fit(X[y != "c"], y[y != "c"])
    >>> clf = clf.partial_fit(X[y == "c"], y[y == "c"])      # a class never seen before
    >>> clf.classes_, clf.score(X, y) > 0.9
    (array(['a', 'b', 'c'], dtype='<U1'), True)
    """

    _head_class = FeCAM
    _fixed_params = ("tukey", "l2", "ddof")

    def _apply_batch(self, X, y_ids, kwargs, *, reset):
        Z = self._head_class(**kwargs).transform(X)  # FeCAM's statistics: transformed features
        if not torch.isfinite(Z).all():
            raise ValueError(f"{type(self).__name__}: the Tukey power {self.tukey} overflows "
                             "float64 on these features; rescale them or lower tukey")
        return super()._apply_batch(Z, y_ids, kwargs, reset=reset)

    def _new_stats(self, n_features: int) -> ClassGaussians:
        return ClassGaussians(n_features, ddof=self.ddof)


class _MappedClassifier(_GaussianClassifier):
    """Estimators over a :class:`~gdacil.heads.MappedLinearHead`: the head maps the raw features
    and keeps the pooled statistics itself; every ``partial_fit`` solves it."""

    _STATE_DOC = _MAPPED_STATE

    def _forget_ids(self, ids: list[int], kwargs: dict | None) -> None:
        self.head_.forget(ids)  # the statistics are the head's; it refuses unless forgettable
        if kwargs is not None:
            self.head_.set_params(**kwargs).solve()

    def _apply_batch(self, X, y_ids, kwargs, *, reset):
        head = self._head_class(**kwargs) if reset else self.head_
        _update_and_solve(head, kwargs, X, y_ids)
        return head.stats_, head


class RanPACClassifier(_MappedClassifier):
    """RanPAC's analytic head (:class:`gdacil.heads.RanPAC`): a random ReLU projection of the
    features to ``dim_out`` dimensions, then ridge regression on one-hot targets.

    Scores are the ridge outputs ``h^T W`` (targets 0/1), not log-posteriors; ``predict_proba``
    is their softmax, which keeps the ranking. With ``lam="auto"`` every ``partial_fit`` chooses
    the penalty from a seeded 80/20 holdout split of THAT batch (so each call needs at least 2
    samples, and the model depends on how the data were split into calls: the penalty is the last
    batch's choice, ``head_.lam_history_`` lists them all); with a numeric ``lam``, fitting in
    shards gives the model of one ``fit`` up to round-off. ``dim_out`` and ``seed`` define the
    map and are fixed by the first batch.

    Parameters
    ----------
    dim_out : int >= 0, default 10000
        Projection dimension ``M`` (0: ridge on the raw features). The statistics hold an
        ``M x M`` matrix (0.8 GB at the default): use a few hundred for small problems.
    lam : "auto" or float > 0, default "auto"
        Ridge penalty, or "auto" to choose it from ``lam_grid`` on each batch.
    seed : int, default 0
        Seeds the projection and the holdout splits.
    lam_grid : sequence of float, default ``10^-8, ..., 10^8``
    train_fraction : float in (0, 1), default 0.8
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from gdacil.sklearn import RanPACClassifier
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(["cat", "dog", "owl"], 50)
    >>> X = rng.normal(size=(150, 8)) + 2.0 * np.eye(3, 8)[np.repeat([0, 1, 2], 50)]
    >>> clf = RanPACClassifier(dim_out=128).partial_fit(X[:100], y[:100])
    >>> clf = clf.partial_fit(X[100:], y[100:])                # "owl" is new
    >>> clf.classes_, clf.score(X, y) > 0.9, len(clf.head_.lam_history_)
    (array(['cat', 'dog', 'owl'], dtype='<U3'), True, 2)
    """

    _head_class = RanPAC
    _fixed_params = ("dim_out", "seed", "forgettable")

    def _apply_batch(self, X, y_ids, kwargs, *, reset):
        if _same(self.lam, "auto") and X.shape[0] < 2:
            raise ValueError(f"{type(self).__name__}(lam='auto') chooses lam on a holdout split "
                             f"of each batch, which needs at least 2 samples; got {X.shape[0]}. "
                             "Pass larger batches or a numeric lam")
        return super()._apply_batch(X, y_ids, kwargs, reset=reset)


class ACILClassifier(_MappedClassifier):
    """ACIL's analytic head (:class:`gdacil.heads.ACIL`): a uniform random ReLU buffer of
    ``buffer_size`` features, then ridge regression on one-hot targets with penalty ``gamma``.

    Scores are the ridge outputs (targets 0/1), not log-posteriors; ``predict_proba`` is their
    softmax. ACIL's recursive least squares is this joint ridge, so fitting in shards gives the
    model of one ``fit`` up to round-off. ``gamma`` is absolute: predictions depend on the scale
    of the features (scale them, e.g. with a ``StandardScaler``). ``buffer_size`` and ``seed``
    define the map and are fixed by the first batch.

    Parameters
    ----------
    buffer_size : int, default 8192
        Buffer dimension ``M``; the statistics hold an ``M x M`` matrix (0.54 GB at the
        default): use a few hundred for small problems.
    gamma : float > 0, default 0.1
    seed : int, default 0
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from gdacil.sklearn import ACILClassifier
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat([3, 1, 2], 50)
    >>> X = 100.0 * (rng.normal(size=(150, 8)) + 2.0 * np.eye(3, 8)[np.repeat([0, 1, 2], 50)])
    >>> clf = make_pipeline(StandardScaler(), ACILClassifier(buffer_size=256)).fit(X, y)
    >>> clf.classes_, clf.score(X, y) > 0.9
    (array([1, 2, 3]), True)
    """

    _head_class = ACIL
    _fixed_params = ("buffer_size", "seed", "forgettable")


class RBFLDAClassifier(_MappedClassifier):
    """LDA on random Fourier features (:class:`gdacil.heads.RBFLDA`; KLDA, RanDumb): an RBF
    kernel approximated by ``dim_out`` features, one OAS-shrunk pooled covariance.

    Scores are LDA log-posteriors in the mapped space up to a per-sample constant, so
    ``predict_proba`` is the LDA posterior. ``bandwidth="auto"`` is set from the first batch
    (the root-mean-square distance between its samples, so that batch needs 2 distinct samples);
    with a numeric bandwidth, fitting in shards gives the model of one ``fit`` up to round-off.
    ``dim_out``, ``bandwidth`` and ``seed`` define the map and are fixed by the first batch.

    Parameters
    ----------
    dim_out : int, default 5000
        Number of random Fourier features ``D``; the statistics hold a ``D x D`` matrix (0.2 GB
        at the default): use a few hundred for small problems.
    bandwidth : float > 0 or "auto", default "auto"
    shrinkage : "oas", float in [0, 1] or None, default "oas"
    seed : int, default 0
    {shared_parameters}

    Examples
    --------
    >>> import numpy as np
    >>> from gdacil.sklearn import RBFLDAClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 2))
    >>> y = np.where(np.hypot(X[:, 0], X[:, 1]) < 1.0, "inner", "outer")  # not linearly separable
    >>> clf = RBFLDAClassifier(dim_out=256, bandwidth=1.0).fit(X, y)
    >>> clf.score(X, y) > 0.9, clf.predict([[0.0, 0.1], [2.0, 2.0]])
    (True, array(['inner', 'outer'], dtype='<U5'))
    """

    _head_class = RBFLDA
    _fixed_params = ("dim_out", "bandwidth", "seed", "forgettable")
