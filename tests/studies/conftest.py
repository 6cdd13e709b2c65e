"""The studies set torch's thread count for their run (`config.threads`) and leave it set, as
a command-line run wants; in the test process that would carry over to every later test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
