"""Experiment configuration: small typed dataclasses, loaded from YAML with errors that say what
to fix.

An :class:`ExperimentConfig` is a :class:`gdacil.typed_config.TypedConfig` whose sections are
typed configs too: ``protocol`` a :class:`~gdacil.data.ProtocolConfig`, ``strategy`` a
:class:`StrategySpec`, ``compensators`` a mapping label -> :class:`CompensatorConfig`, ``heads``
label -> :class:`HeadConfig`, and so on. :func:`load_config` reads YAML, applies ``--set``
overrides (any dotted key, e.g. ``protocol.increment=5``, ``strategy.train.lr=0.001``,
``compensators.hopdc.topk=100``) and validates the whole; :meth:`ExperimentConfig.to_dict` is
what a run records in ``results.json``, and :meth:`ExperimentConfig.from_dict` reads it back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, cast

from .._validation import check_choice, check_positive_int
from ..data.protocol import ProtocolConfig
from ..typed_config import ConfigError, TypedConfig

__all__ = [
    "REPORTING_KEYS",
    "AnchorConfig",
    "BackboneConfig",
    "CompensatorConfig",
    "ConfigError",
    "ExperimentConfig",
    "HeadConfig",
    "ProtocolConfig",
    "StatisticsConfig",
    "StrategySpec",
    "apply_overrides",
    "check_output_name",
    "config_from_dict",
    "load_config",
    "without_reporting_keys",
]


#: Settings of :class:`ExperimentConfig` (dotted paths) that change where a run writes, how it
#: reports its progress or how fast it runs, never its results: left out of its fingerprint and
#: of ``results.json``, so a run resumes with other values.
REPORTING_KEYS = ("output_dir", "cache_dir", "progress", "threads", "tensorboard",
                  "backbone.num_workers")


def without_reporting_keys(config: dict) -> dict:
    """``config`` (:meth:`ExperimentConfig.to_dict`) without :data:`REPORTING_KEYS`, in place."""
    for key in REPORTING_KEYS:
        *parents, leaf = key.split(".")
        section = config
        for parent in parents:
            section = section[parent]
        section.pop(leaf)
    return config


def check_output_name(name) -> str:
    """``name`` if it can name a run's folder under ``runs/``: one non-empty path component, so
    the default output directory ``runs/<name>`` never leaves ``runs/``. Raises
    :class:`ConfigError` otherwise (``../x``, ``/tmp/x``, ``a/b``, ``..``, control characters)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"name: expected a non-empty string, got {name!r}")
    seps = cast("set[str]", {"/", "\\", os.sep, os.altsep} - {None})
    problem = ("is a relative path component" if name in (".", "..")
               else "is an absolute path" if Path(name).anchor
               else "contains a path separator" if any(sep in name for sep in seps)
               else "contains a control character" if any(ord(ch) < 32 for ch in name)
               else None)
    if problem:
        raise ConfigError(f"name: {name!r} {problem}; the name becomes the folder runs/<name>, so "
                          "use a plain name (letters, digits, - _ .), and output_dir to write "
                          "somewhere else")
    return name


@dataclass
class BackboneConfig(TypedConfig):
    """Which backbone extracts features; ``options`` go to its factory."""

    name: str = "minilm"
    options: dict = field(default_factory=dict)
    projection_dim: int | None = None  # random ReLU projection (RanPAC-style) on top, if set
    projection_seed: int = 0
    batch_size: int = 64
    # forward passes of extraction and Stage-1 training: fp32, or bf16/fp16 under autocast;
    # "auto": bf16 where the device computes it natively (a GPU; a CPU with AVX512-BF16 or
    # AMX), fp32 elsewhere
    precision: str = "auto"
    # processes that load and preprocess samples (extraction) and build training batches
    # (Stage-1) while the model runs; "auto": none on the CPU (they would compete with the
    # forward passes), min(8, CPUs - 1) on a GPU. Results do not depend on it.
    num_workers: int | str = "auto"

    def resolved_precision(self) -> str:
        """:attr:`precision` with ``"auto"`` resolved for the device in :attr:`options` (the CPU
        when unset): what extraction and Stage-1 training run in."""
        from ..backbones.base import resolve_precision

        return resolve_precision(self.precision, self.options.get("device"))

    def resolve_workers(self, device) -> int:
        """``num_workers`` as a count for a backbone on ``device``."""
        if self.num_workers != "auto":
            return cast(int, self.num_workers)  # validated: an int or "auto"
        cpus = os.cpu_count() or 1
        return 0 if torch_device_type(device) == "cpu" else max(0, min(8, cpus - 1))


@dataclass
class HeadConfig(TypedConfig):
    """One head to build after every task: a registered ``name``, its parameters, and
    optionally ``defaults: paper``, the LR-RGDA paper's preset (``LDA.paper()``, ``RGDA.paper()``,
    ``LRRGDA.paper()``) that the parameters then override.

    A streaming head (``gdacil.heads.STREAMING_HEADS``: ``ranpac``, ``acil``, ``rbf_lda``) is not
    built from class statistics: it takes each task's training features (``partial_fit``), once
    per run, outside the compensator tracks (see :mod:`gdacil.cil.runner`).
    """

    name: str = "lr_rgda"
    params: dict = field(default_factory=dict)
    defaults: str | None = None

    @property
    def streaming(self) -> bool:
        """Whether the head learns from features rather than from class statistics."""
        from ..heads import MappedLinearHead, head_class

        return issubclass(head_class(self.name), MappedLinearHead)

    def build(self):
        """A new, unfitted head."""
        from ..heads import build_head

        return build_head(self.name, defaults=self.defaults, **self.params)


@dataclass
class AnchorConfig(TypedConfig):
    """Unlabelled anchors for drift compensation: ``n`` drawn with ``seed``, plus the current
    task's training samples when ``include_current`` (the LR-RGDA paper's choice).

    They come from ``pool`` of the protocol's own datasets (:func:`gdacil.data.draw_anchors`), or,
    when ``dataset`` names a registered dataset outside the protocol, from that dataset's
    ``splits`` (all by default), built with ``dataset_options``
    (:class:`gdacil.data.ExternalAnchors`): the LR-RGDA paper adds 1024 ImageNet images this way.
    """

    n: int = 1024
    seed: int = 0
    pool: str = "outside"
    include_current: bool = True
    dataset: str | None = None
    dataset_options: dict = field(default_factory=dict)
    splits: list | None = None

    def build_external(self):
        """The :class:`gdacil.data.ExternalAnchors` of ``dataset`` (None without one)."""
        from ..data import DataNotFoundError, ExternalAnchors, build_dataset

        if self.dataset is None or not self.n:
            return None
        try:
            dataset = build_dataset(self.dataset, **self.dataset_options)
        except DataNotFoundError as exc:  # point at the anchors' setting, not the protocol's
            raise DataNotFoundError(str(exc).replace(
                f"protocol.dataset_options.{self.dataset}.root", "anchors.dataset_options.root")
            ) from None
        return ExternalAnchors(dataset, self.n, seed=self.seed, splits=self.splits)


@dataclass
class StatisticsConfig(TypedConfig):
    """How each track stores its class statistics.

    ``storage: dense`` keeps a float64 ``d x d`` covariance per class (:class:`gdacil.ClassGaussians`).
    ``storage: lowrank`` accumulates each task's new classes densely, then keeps only their
    top-``rank`` covariance eigenpairs (eigenvectors in ``dtype``) and residual variance
    (:class:`gdacil.LowRankGaussians`), found by ``decomposition`` ("eigh" or the seeded
    "randomized"); the average covariance stays exact up to drift compensation (see
    :mod:`gdacil.stats.lowrank`). ``rank``, ``dtype`` and ``decomposition`` apply to lowrank only.
    """

    storage: str = "dense"
    rank: int = 128
    dtype: str = "float64"
    decomposition: str = "eigh"

    def __post_init__(self):
        check_choice(self.storage, "storage", ("dense", "lowrank"))
        check_positive_int(self.rank, "rank")
        check_choice(self.dtype, "dtype", ("float32", "float64"))
        check_choice(self.decomposition, "decomposition", ("eigh", "randomized"))

    def empty(self, dim: int, ddof: int):
        """Empty statistics of this storage for features of dimension ``dim``."""
        from ..stats import ClassGaussians, LowRankGaussians

        if self.storage == "dense":
            return ClassGaussians(dim, ddof=ddof)
        if self.rank > dim:
            raise ConfigError(f"statistics.rank = {self.rank} exceeds the feature dimension {dim}")
        return LowRankGaussians(dim, self.rank, ddof=ddof, dtype=self.dtype,
                                decomposition=self.decomposition)


@dataclass
class StrategySpec(TypedConfig):
    """The Stage-1 strategy of an experiment, written flat in a config:
    ``strategy: {name: seqft, defaults: reference, train: {steps: 300}}``.

    Parameters
    ----------
    name : str
        A preset of :data:`gdacil.adapt.STRATEGIES` (``gdacil list strategies``).
    defaults : {"paper", "reference"}, optional
        The hyperparameters the preset starts from (None: ``"paper"``).
    overrides : dict
        :class:`gdacil.adapt.StrategyConfig` fields that replace the preset's: every key of the
        section but ``name`` and ``defaults``; nested ones (``train``, ``lora``, ``null_space``)
        update the preset's key by key. Checked when the strategy is built (:meth:`build`).
    """

    name: str
    defaults: str | None = None
    overrides: dict = field(default_factory=dict)

    _rest: ClassVar[str | None] = "overrides"

    def build(self):
        """The :class:`gdacil.adapt.Strategy`."""
        from ..adapt import build_strategy

        return build_strategy(self.name, defaults=self.defaults or "paper", **self.overrides)


@dataclass
class CompensatorConfig(TypedConfig):
    """One compensator track of an experiment, written flat in a config:
    ``hopdc: {name: hopdc, defaults: paper, topk: 100, anchors: 256}``.

    Parameters
    ----------
    name : str
        A key of :data:`gdacil.drift.COMPENSATORS` (``gdacil list compensators``).
    defaults : str, optional
        The preset the hyperparameters start from (None: ``"recommended"``; ``"paper"`` for
        HopDC and alpha1-SLDC as the LR-RGDA paper ran them).
    anchors : int, optional
        How many of the run's external anchors the track fits on (None: all of them).
    params : dict
        Hyperparameters that replace the preset's: every key of the track but ``name``,
        ``defaults`` and ``anchors``. Checked when the compensator is built (:meth:`build`).
    """

    name: str
    defaults: str | None = None
    anchors: int | None = None
    params: dict = field(default_factory=dict)

    _rest: ClassVar[str | None] = "params"

    def build(self):
        """A new, unfitted :class:`gdacil.drift.Compensator`."""
        from ..drift import build_compensator

        return build_compensator(self.name, defaults=self.defaults or "recommended",
                                 **self.params)


def _check_head_params(head: HeadConfig, where: str) -> None:
    """Refuse an unknown head, parameters its constructor does not take (deprecated aliases are
    taken), and values it refuses."""
    from .._deprecation import accepted_parameters
    from ..heads import head_class

    try:
        cls = head_class(head.name)
    except ValueError as exc:
        raise ConfigError(str(exc), path=where) from None
    accepted = accepted_parameters(cls)
    unknown = sorted(set(head.params) - accepted)
    if unknown:
        raise ConfigError(f"head {head.name!r} has no parameter(s) {unknown}; "
                          f"it takes {sorted(accepted)}", path=where)
    try:
        head.build()._check_params()  # the checks fit runs, here before any feature is extracted
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"head {head.name!r}: {exc}", path=where) from None


def _heads(value, where: str) -> dict[str, HeadConfig]:
    """``heads`` maps a label to ``{name: ..., params: {...}}`` or, briefly, to the params of the
    head registered under the label itself (``lda: {shrinkage: 0.1}``); a list names heads
    with their default parameters. :class:`HeadConfig` instances are kept as they are."""
    if isinstance(value, list):
        value = {name: {} for name in value}
    if not isinstance(value, dict) or not value:
        raise ConfigError("expected a non-empty mapping label -> head settings", path=where)
    out = {}
    for label, spec in value.items():
        path = f"{where}.{label}"
        if isinstance(spec, HeadConfig):
            out[str(label)] = spec
            continue
        spec = {} if spec is None else spec
        if not isinstance(spec, dict):
            raise ConfigError(f"expected a mapping, got {spec!r}", path=path)
        if "name" in spec or "params" in spec:
            head = HeadConfig.from_dict(spec, where=path)
        else:
            params = dict(spec)
            defaults = params.pop("defaults", None)
            head = HeadConfig.from_dict({"name": str(label), "params": params,
                                         "defaults": defaults}, where=path)
        _check_head_params(head, path)
        out[str(label)] = head
    return out


@dataclass
class ExperimentConfig(TypedConfig):
    """A whole class-incremental experiment (see the module docstring)."""

    name: str = "experiment"
    seeds: list = field(default_factory=lambda: [1993])
    # the run seed of each protocol comes from ``seeds``
    protocol: ProtocolConfig = field(
        default_factory=lambda: ProtocolConfig(("wordnet-hypernym",), increment=10))
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    heads: dict[str, HeadConfig] = field(default_factory=lambda: {"lr_rgda": HeadConfig()},
                                         metadata={"parse": _heads})
    strategy: StrategySpec = field(default_factory=lambda: StrategySpec("frozen"))
    # one track of class statistics per compensator
    compensators: dict[str, CompensatorConfig] = field(
        default_factory=lambda: {"none": CompensatorConfig("identity")})
    anchors: AnchorConfig = field(default_factory=AnchorConfig)
    drift_diagnostics: bool = False  # compare each track with recomputed (oracle) statistics
    # how tracks store class statistics: dense covariances or compressed top eigenpairs
    statistics: StatisticsConfig = field(default_factory=StatisticsConfig)
    threads: int | None = None  # torch CPU threads for the run (None: torch's default)
    ddof: int = 0
    output_dir: str | None = None  # default: runs/<name>, plus -<hash> of the --set overrides
    cache_dir: str = "~/.cache/gdacil/features"
    progress: bool = True
    # TensorBoard scalars under <output_dir>/tensorboard/ (gdacil.callbacks.TensorBoardLogger)
    tensorboard: bool = False

    def __post_init__(self):
        """Validate everything before any work starts; one :class:`ConfigError` lists every
        problem found."""
        self._coerce_nested()
        problems = []
        for where, check in self._checks():
            try:
                check()
            except (ConfigError, TypeError, ValueError, KeyError) as exc:
                message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
                problems.append(message if isinstance(exc, ConfigError) or not where
                                else f"{where}: {message}")
        if len(problems) == 1:
            raise ConfigError(problems[0])
        if problems:
            raise ConfigError(f"{len(problems)} problems:\n" + "\n".join(f"- {p}" for p in problems))

    def _checks(self):
        """``(where, check)`` pairs: each check raises on a problem of its part of the config."""
        yield "", lambda: check_output_name(self.name)
        yield "seeds", self._check_seeds
        yield "", lambda: _require(self.ddof in (0, 1), f"ddof must be 0 or 1; got {self.ddof!r}")
        yield "", lambda: _require(bool(self.heads), "heads: configure at least one head")
        yield "strategy", self.build_strategy
        yield "", lambda: _require(bool(self.compensators), "compensators: configure at least one "
                                                             "(e.g. none: {name: identity})")
        for label in self.compensators:
            yield f"compensators.{label}", lambda label=label: self.build_compensator(label)._check_params()
        yield "anchors", self._check_anchors
        yield "threads", self._check_threads
        yield "backbone", self._check_backbone
        yield "backbone.precision", self._check_precision
        yield "backbone.num_workers", lambda: _require(
            self.backbone.num_workers == "auto" or (
                isinstance(self.backbone.num_workers, int)
                and not isinstance(self.backbone.num_workers, bool)
                and self.backbone.num_workers >= 0),
            f"backbone.num_workers: expected \"auto\" or an integer >= 0; got "
            f"{self.backbone.num_workers!r}")

    def _check_anchors(self) -> None:
        from ..data import ANCHOR_POOLS, DATASETS

        a = self.anchors
        check_choice(a.pool, "pool", ANCHOR_POOLS)
        if a.dataset is None:
            if a.dataset_options or a.splits is not None:
                raise ValueError("dataset_options and splits describe an external anchor "
                                 "dataset: set anchors.dataset too")
            return
        DATASETS[a.dataset]  # an unknown name lists the known ones
        if a.dataset in self.protocol.datasets:
            raise ValueError(f"{a.dataset!r} is one of the protocol's datasets; draw its anchors "
                             "with anchors.pool (outside, unused, both) instead")
        if a.pool != "outside":
            raise ValueError("anchors.pool selects among the protocol's own samples; it does "
                             "not apply to an external anchors.dataset")

    def _check_seeds(self) -> None:
        if not self.seeds:
            raise ValueError("give at least one seed")
        bad = [s for s in self.seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
        if bad:
            raise ValueError(f"seeds must be non-negative integers; got {bad}")
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if repeated:
            raise ValueError(f"seed(s) {repeated} appear more than once")

    def _check_threads(self) -> None:
        limit = 4 * (os.cpu_count() or 1)
        if self.threads is not None and (isinstance(self.threads, bool)
                                         or not isinstance(self.threads, int)
                                         or not 1 <= self.threads <= limit):
            raise ValueError(f"expected an integer from 1 to {limit} (4 x this machine's "
                             f"{os.cpu_count()} CPUs) or null; got {self.threads!r}")

    def check_backbone_options(self) -> None:
        """Refuse (:class:`ConfigError`) an unknown backbone name or an option its factory does
        not take, naming the options it takes: what :func:`~gdacil.cil.run_experiment` (and so
        ``gdacil run``) checks before any work.
        Not part of reading a config, which may describe a backbone not installed here."""
        from ..backbones import BACKBONES, check_backbone_options

        bb = self.backbone
        try:
            BACKBONES[bb.name]  # an unknown name lists the known ones
            check_backbone_options(bb.name, bb.options)
        except ValueError as exc:
            raise ConfigError(str(exc), path="backbone.options" if bb.name in BACKBONES
                              else "backbone.name") from None

    def _check_backbone(self) -> None:
        """The backbone's numbers, so that a run is refused when the config is read, not once
        features are being extracted."""
        bb = self.backbone
        for key, value, low in (("batch_size", bb.batch_size, 1),
                                ("projection_seed", bb.projection_seed, 0),
                                ("projection_dim", bb.projection_dim, 1)):
            if value is not None or key != "projection_dim":
                try:
                    check_positive_int(value, f"backbone.{key}", minimum=low)
                except (TypeError, ValueError) as exc:
                    raise ConfigError(str(exc)) from None

    def _check_precision(self) -> None:
        from ..backbones.base import check_precision

        check_precision(self.backbone.precision, self.strategy.name)

    def build_strategy(self):
        """The Stage-1 :class:`gdacil.adapt.Strategy` of this experiment."""
        return self.strategy.build()

    def build_compensator(self, label: str):
        """The compensator of track ``label``."""
        self.track_anchors(label)
        return self.compensators[label].build()

    def track_anchors(self, label: str) -> int | None:
        """How many of the run's external anchors track ``label`` fits on (None: all of them).

        A track's ``anchors: n`` takes a nested random subset of the ``anchors.n`` drawn for
        the run (see :func:`gdacil.cil.runner.anchor_subset`), so one run can sweep the
        auxiliary-set size; the current task's samples are added as for every track.
        """
        n = self.compensators[label].anchors
        if n is not None and not 0 <= n <= self.anchors.n:
            raise ValueError(f"anchors must be an integer from 0 to anchors.n = {self.anchors.n}; "
                             f"got {n!r}")
        return n

    def build_protocol(self, seed: int):
        """The :class:`gdacil.data.Protocol` of this experiment for run seed ``seed``."""
        return self.protocol.with_seed(seed)


def torch_device_type(device) -> str:
    """``"cpu"``, ``"cuda"``, ... of a device, a device string or None (the CPU)."""
    import torch

    return torch.device(device or "cpu").type


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def config_from_dict(cls, data, where: str = ""):
    """``cls.from_dict(data, where=where)``: build config dataclass ``cls`` from a mapping,
    refusing unknown keys and values of the wrong type (see :mod:`gdacil.typed_config`)."""
    return cls.from_dict(data, where=where)


def _yaml():
    from .._optional import require

    return require("yaml", feature="YAML configs", install="pip install 'gdacil[cli]'")


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a raw config mapping."""
    yaml = _yaml()

    data = dict(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value (e.g. --set seeds=[1,2])")
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML "
                              f"({' '.join(str(exc).split())})") from None
        except RecursionError:
            raise ConfigError(f"--set {key}=...: the value is nested too deeply") from None
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
            node[part] = child = dict(child)
            node = child
        node[parts[-1]] = value
    return data


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                *, base: dict | None = None) -> ExperimentConfig:
    """Read a YAML config (or start from ``base``), apply ``--set`` overrides, validate.

    The config remembers the overrides (``cfg.overrides``, not a setting): the default output
    folder of a run with overrides is ``runs/<name>-<hash of the overrides>``, so a variant never
    replaces the plain run's results, and ``results.md`` lists them."""
    yaml = _yaml()

    data: dict = dict(base or {})
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"{path} is a folder, not a config file (see `gdacil list "
                              "configs`)")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist (see `gdacil list configs`)")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a text file (not UTF-8: {exc.reason} at byte "
                              f"{exc.start})") from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to be a config") from None
        if loaded is None:  # nothing but comments and blank lines: no experiment was described
            raise ConfigError(f"{path} is empty: write the settings of an experiment in it "
                              "(see `gdacil list configs` for examples)")
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of settings")
        data.update(loaded)
    data = apply_overrides(data, overrides or [])
    cfg = ExperimentConfig.from_dict(data)
    cfg.overrides = tuple(overrides or ())  # type: ignore[attr-defined]  # not a field
    return cfg
