"""Fixtures the fault tests share: ``model``, a tiny image model the CLI learned
(test_cli_errors.py), and ``interrupted``, a run stopped after its first task
(test_faults_storage.py)."""

from test_cli_errors import model  # noqa: F401
from test_faults_storage import interrupted  # noqa: F401
