import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = os.path.join(HERE, "models", "toy.py")
sys.path.insert(0, os.path.dirname(TOY))  # `import toy` for the model classes themselves


@pytest.fixture
def toy():
    """Path of the toy-models file, for 'toy.py:Name' targets."""
    return TOY


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """No device profile cached on the developer's machine leaks into a test."""
    monkeypatch.setenv("ARCHSCAN_CACHE_DIR", str(tmp_path_factory.mktemp("archscan-cache")))
