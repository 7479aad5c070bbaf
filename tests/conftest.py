import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = os.path.join(HERE, "models", "toy.py")
sys.path.insert(0, os.path.dirname(TOY))  # `import toy` for the model classes themselves
# the text report's width when it goes to a pipe (archscan.report.text.DEFAULT_WIDTH), whatever the
# terminal pytest runs in: pytest-xdist's workers are told COLUMNS=80
os.environ["COLUMNS"] = "120"


@pytest.fixture
def toy():
    """Path of the toy-models file, for 'toy.py:Name' targets."""
    return TOY


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """No device profile cached on the developer's machine leaks into a test."""
    monkeypatch.setenv("ARCHSCAN_CACHE_DIR", str(tmp_path_factory.mktemp("archscan-cache")))
