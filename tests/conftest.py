import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = os.path.join(HERE, "models", "toy.py")


@pytest.fixture
def toy():
    """Path of the toy-models file, for 'toy.py:Name' targets."""
    return TOY
