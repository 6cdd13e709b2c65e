"""The studies' arms: dense and the registered policies, by the registry's names."""

from __future__ import annotations

import pytest

from randkv.selectors.registry import policy_names
from studies.arms import DENSE, arm_names, find_arm
from studies.ledger.arms import COMPARED as LEDGER_COMPARED
from studies.ledger.arms import SCORED, ledger_arm
from studies.ledger.evaluate import LedgerEvalConfig
from studies.pointer.evaluate import COMPARED as POINTER_COMPARED
from studies.pointer.evaluate import EvalConfig


def test_studies_compare_registered_policies_behind_dense():
    assert EvalConfig().evictors == (DENSE, *POINTER_COMPARED)
    assert LedgerEvalConfig().evictors == (DENSE, *LEDGER_COMPARED)
    assert {*POINTER_COMPARED, *LEDGER_COMPARED} <= set(policy_names())
    assert set(SCORED) <= set(LEDGER_COMPARED)
    assert arm_names() == (DENSE, *policy_names())
    assert find_arm(DENSE).dense and not find_arm(DENSE).random and find_arm("randkv").random
    assert not find_arm("h2o").random
    with pytest.raises(ValueError, match="unknown evictor 'nope'; choose from"):
        find_arm("nope")
    # The pointer chain cannot tell an oracle its problems' future; the ledger can.
    with pytest.raises(ValueError, match="future uses"):
        find_arm("oracle")
    assert ledger_arm("oracle").knows_future and not ledger_arm("rkv").knows_future
