"""Benchmarks measure gdacil through its public interfaces (callbacks, ``timings.json``, return
values) and never patch it: no module of ``gdacil.bench`` assigns to, deletes or ``setattr``s an
attribute (or item) of a gdacil module, class or function it imports (benchmarks/README.md)."""

import ast
from pathlib import Path

import pytest

import gdacil.bench

BENCH = Path(gdacil.bench.__file__).parent


def _imported_gdacil_names(tree: ast.Module, package: str) -> set[str]:
    """Names a module binds, anywhere in it, to gdacil modules or their members: relative
    imports, ``from gdacil... import x``, ``import gdacil...``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module == package or module.startswith(package + "."):
                names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == package or a.name.startswith(package + "."):
                    names.add(a.asname or a.name.split(".")[0])
    return names


def _root(node: ast.expr) -> ast.expr:
    """``a`` of ``a.b.c``, ``a.b[k]``, ``a.__dict__["x"]``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _targets(node: ast.AST):
    if isinstance(node, (ast.Assign, ast.Delete)):
        pending = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        pending = [node.target]
    else:
        return
    while pending:
        target = pending.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            pending += target.elts
        elif isinstance(target, ast.Starred):
            pending.append(target.value)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            yield target


def patches(source: str, package: str = "gdacil") -> list[str]:
    """``line: code`` of every place ``source`` writes into a gdacil module, class or function
    it imports (attribute or item assignment, ``del``, ``setattr``/``delattr``), or into
    ``sys.modules``."""
    tree = ast.parse(source)
    names = _imported_gdacil_names(tree, package)

    def foreign(expr: ast.expr) -> bool:
        root = _root(expr)
        if isinstance(root, ast.Name) and root.id in names:
            return True
        return (isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute)
                and ast.unparse(expr.value) == "sys.modules")

    def sets_attribute(node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr") and bool(node.args)
                and foreign(node.args[0]))

    hits = [node for node in ast.walk(tree)
            if any(map(foreign, _targets(node))) or sets_attribute(node)]
    return [f"{node.lineno}: {ast.unparse(node)}"
            for node in sorted(hits, key=lambda n: n.lineno)]


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_no_benchmark_patches_gdacil(path):
    assert patches(path.read_text()) == []


def test_the_check_sees_patching_in_its_usual_forms():
    source = '''
import gdacil.cil.runner
from gdacil.data import cache as data_cache

def probing():
    from ..backbones.base import Backbone
    from ..cil import runner
    from . import common
    saved = runner._SeedRun.run_task
    runner._SeedRun.run_task, runner.save_checkpoint = saved, saved
    data_cache.extract_features = lambda *a: None
    Backbone.fingerprint = None
    gdacil.cil.runner.save_checkpoint = None
    runner.__dict__["save_checkpoint"] = None
    common.DEFAULT_OUT += "x"
    setattr(Backbone, "fingerprint", None)
    delattr(runner._SeedRun, "run_task")
    del runner.save_checkpoint
    import sys
    sys.modules["gdacil.cil.runner"] = None
'''
    assert [hit.split(":")[0] for hit in patches(source)] == [
        "10", "11", "12", "13", "14", "15", "16", "17", "18", "20"]


def test_the_check_leaves_ordinary_assignments_alone():
    source = '''
import numpy as np
import torch
from ..backbones import build_backbone
from .common import machine_info

class Clock:
    def __init__(self):
        self.rows = []
        self.rows[0:0] = [1]

def run(cfg, args):
    bb = build_backbone("vit")
    bb.model.train(False)
    for p in bb.model.parameters():
        p.grad = None
    machine = machine_info()
    machine["load"] = 1.0
    cfg.threads, cfg.note = args.threads, args.note
    setattr(cfg, "repeats", 3)
    torch.backends.cudnn.benchmark = True
    np.seterr(all="raise")
'''
    assert patches(source) == []
