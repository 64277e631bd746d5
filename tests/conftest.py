import pytest


@pytest.fixture
def _asset_missing_in_ci(request):
    pytest.fail(
        f"{request.node.name}: an offline asset it needs is not installed; "
        f".ci/run must install it (see tests/_assets.py)"
    )
