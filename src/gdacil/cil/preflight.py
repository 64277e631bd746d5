"""What a run would miss, found before it starts (``gdacil run CONFIG --check``): the data of
every dataset of the protocol and the backbone's weights, each problem with the message that
says where to get the missing piece and which setting points at it."""

from __future__ import annotations

from .config import ExperimentConfig

__all__ = ["preflight"]


def preflight(cfg: ExperimentConfig) -> list[str]:
    """Every problem that would stop a run of ``cfg``, as messages; empty when it can start.

    Builds each dataset and indexes its splits (nothing is written, no sample is decoded) and
    builds the backbone (which loads its weights).
    """
    from ..data import build_dataset
    from .runner import build_feature_backbone

    problems = []
    options = cfg.protocol.dataset_options
    for name in cfg.protocol.datasets:
        try:
            dataset = build_dataset(name, **options.get(name, {}))
            for split in dataset.splits:
                dataset.index(split)
        except (OSError, ValueError, ImportError) as exc:
            hint = f"--set protocol.dataset_options.{name}.root="
            problems.append(f"dataset {name!r}: {exc}" + ("" if hint in str(exc) else
                            f" (set its folder with {hint}PATH)"))
    if cfg.anchors.dataset is not None and any(
            c.name != "identity" for c in cfg.compensators.values()):
        try:
            cfg.anchors.build_external()
        except (OSError, ValueError, ImportError) as exc:
            problems.append(f"anchors: {exc}")
    try:
        build_feature_backbone(cfg)
    except (OSError, ValueError, ImportError) as exc:
        problems.append(f"backbone {cfg.backbone.name!r}: {exc}")
    return problems
