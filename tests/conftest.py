import pytest


@pytest.fixture
def _asset_missing_in_ci(request):
    pytest.fail(
        f"{request.node.name}: an offline asset it needs is not installed; "
        f".ci/run must install it (see tests/_assets.py)"
    )


@pytest.fixture(autouse=True, scope="session")
def _hash_memo_in_a_temporary_folder(tmp_path_factory):
    """File-content hashes memoised by the tests stay out of the user's ~/.cache."""
    import os

    previous = os.environ.get("GDACIL_HASH_CACHE")
    os.environ["GDACIL_HASH_CACHE"] = str(tmp_path_factory.mktemp("hash-memo"))
    yield
    if previous is None:
        os.environ.pop("GDACIL_HASH_CACHE", None)
    else:
        os.environ["GDACIL_HASH_CACHE"] = previous
