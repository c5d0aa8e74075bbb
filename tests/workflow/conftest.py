import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from wf import copy_workflow  # noqa: E402


@pytest.fixture
def workdir(tmp_path):
    return copy_workflow(tmp_path)
