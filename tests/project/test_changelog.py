"""The changelog's newest release is the package's version, with an ISO date."""

import datetime
import re
from pathlib import Path

import gdacil

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def test_the_newest_release_entry_is_the_version_with_a_date():
    headings = re.findall(r"^## (.+)$", CHANGELOG.read_text(), flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    match = re.fullmatch(r"(\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)", headings[1])
    assert match, f"the first release heading must read 'X.Y.Z (YYYY-MM-DD)'; got {headings[1]!r}"
    assert match.group(1) == gdacil.__version__
    datetime.date.fromisoformat(match.group(2))
