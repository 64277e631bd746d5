"""Compensator presets (``paper`` / ``recommended``), in code and in experiment configs; HopDC's
fallbacks for ``topk > N`` and for moment matching with ``n_samples <= d``."""

import warnings

import pytest
import torch

from gdacil import ClassGaussians
from gdacil.cil.config import ConfigError, ExperimentConfig, load_config
from gdacil.cli import shipped_configs
from gdacil.drift import COMPENSATORS, HopDC, LinearSLDC, build_compensator

D = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def problem(n_anchors=60, d=6, seed=0):
    g = gen(seed)
    old = torch.randn(n_anchors, d, generator=g, dtype=D) + 2.0
    new = old + torch.sin(old)
    X = torch.randn(120, d, generator=g, dtype=D) + 2.0
    return old, new, ClassGaussians(d).update(X, torch.arange(120) % 3)


# ----------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name", sorted(COMPENSATORS))
def test_recommended_is_the_constructor_and_what_a_bare_spec_builds(name):
    cls = COMPENSATORS[name]
    assert "recommended" in cls.presets and cls.presets["recommended"] == {}
    built = build_compensator({"name": name}).get_config()
    assert built == cls().get_config() == cls.from_preset("recommended").get_config()


def test_specs_pick_a_preset_then_apply_overrides():
    paper = build_compensator({"name": "hopdc", "defaults": "paper", "tau": 0.1})
    assert paper.get_config() == HopDC.paper(tau=0.1).get_config()
    assert (paper.tau, paper.topk, paper.match_moments) == (0.1, 400, False)
    assert build_compensator("hopdc", defaults="paper").match_moments is False
    assert build_compensator({"name": "hopdc"}).match_moments == "auto"
    assert build_compensator({"name": "hopdc", "defaults": "recommended"}, match_moments=True
                           ).match_moments is True
    sldc = build_compensator({"name": "sldc_linear", "defaults": "paper"})
    assert sldc.ridge_target == "zero" and LinearSLDC().ridge_target == "identity"
    # a saved config round-trips whatever the preset (every field is written)
    for comp in (paper, sldc, HopDC.recommended(topk=None)):
        assert build_compensator(comp.get_config()).get_config() == comp.get_config()


@pytest.mark.parametrize("spec,match", [
    ({"name": "hopdc", "defaults": "papr"},
     r"HopDC has no preset 'papr' \(its presets: 'recommended', 'paper'\)"),
    ({"name": "sdc", "defaults": "paper"},
     r"SDC has no preset 'paper' \(its presets: 'recommended'\)"),
    ({"name": "hopdc", "defaults": 3}, r"no preset 3"),
    ({"name": "hopdc", "defaults": "paper", "temperature": 1}, r"bad configuration.*temperature"),
])
def test_bad_presets_are_clear_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        build_compensator(spec)


def test_no_preset_means_the_constructors_defaults():
    assert build_compensator({"name": "hopdc", "defaults": None}).get_config() == \
        HopDC().get_config()
    assert HopDC.from_preset().get_config() == HopDC.from_preset("recommended").get_config()


def test_config_tracks_use_presets_and_report_bad_ones():
    cfg = ExperimentConfig(compensators={"a": {"name": "hopdc"},
                                         "b": {"name": "hopdc", "defaults": "paper", "topk": 9}})
    assert cfg.build_compensator("a").match_moments == "auto"
    b = cfg.build_compensator("b")
    assert (b.match_moments, b.topk) == (False, 9)
    with pytest.raises(ConfigError, match=r"compensators\.h: .*its presets: 'recommended', 'paper'"):
        ExperimentConfig(compensators={"h": {"name": "hopdc", "defaults": "best"}})


def test_shipped_configs_use_recommended_unless_they_reproduce_the_paper():
    seen = 0
    for name, path in shipped_configs().items():
        cfg = load_config(path)
        for label, spec in cfg.compensators.items():
            comp = cfg.build_compensator(label)
            if comp.name not in ("hopdc", "sldc_linear"):
                continue
            seen += 1
            preset = "paper" if name.startswith("paper-") else "recommended"
            assert (spec.defaults or "recommended") == preset, (name, label)
            expected = type(comp).from_preset(preset).get_config()
            differ = {k for k, v in comp.get_config().items() if expected[k] != v}
            assert differ <= {"topk"}, (name, label, differ)   # cross-domain: k = 100
    assert seen >= 10


# ------------------------------------------------------------------------ HopDC fallbacks


def test_topk_above_the_anchor_count_uses_every_anchor_with_a_warning():
    old, new, stats = problem(n_anchors=60)
    with pytest.warns(UserWarning, match=r"topk=400 exceeds the number of anchors N=60"):
        big = HopDC(n_samples=50, dtype="float64").fit(old, new)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dense = HopDC(n_samples=50, topk=None, dtype="float64").fit(old, new)
        exact = HopDC(n_samples=50, topk=60, dtype="float64").fit(old, new)   # no warning
    Z = torch.randn(40, 6, generator=gen(3), dtype=D) + 2.0
    torch.testing.assert_close(big.drift_at(Z), dense.drift_at(Z), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(exact.drift_at(Z), dense.drift_at(Z), rtol=1e-13, atol=1e-13)
    a, b = big.transform(stats), dense.transform(stats)
    torch.testing.assert_close(a.means, b.means, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(a.covariances(), b.covariances(), rtol=1e-12, atol=1e-13)
    # the weights really are spread over all anchors
    assert bool((big.attention(Z) > 0).all())


def test_auto_moment_matching_falls_back_to_plain_samples_when_d_is_not_below_n_samples():
    old, new, stats = problem(n_anchors=60, d=6)
    with pytest.warns(UserWarning, match=r"n_samples=6 is not above the dimension d=6"):
        auto = HopDC(n_samples=6, topk=20, dtype="float64", linear=False,
                     shrink=False).fit(old, new)
    assert auto.match_moments_ is False
    plain = HopDC.paper(n_samples=6, topk=20, dtype="float64").fit(old, new)
    assert plain.match_moments_ is False
    a, b = auto.transform(stats), plain.transform(stats)
    assert torch.equal(a.means, b.means) and torch.equal(a.scatters, b.scatters)
    # asked for explicitly, it is an error naming both numbers, raised by fit
    with pytest.raises(ValueError, match=r"match_moments=True .* n_samples=6 for dimension d=6"):
        HopDC(n_samples=6, topk=20, match_moments=True).fit(old, new)
    # one sample more than d: matched, with no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert HopDC(n_samples=7, topk=20).fit(old, new).match_moments_ is True


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_match_moments_values_are_checked(value):
    old, new, _ = problem()
    with pytest.raises(ValueError, match="match_moments must be True, False or 'auto'"):
        HopDC(match_moments=value, topk=20).fit(old, new)
