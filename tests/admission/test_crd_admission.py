"""Admission is complete: for every CRD, each object in its table (cases_<kind>.py) is refused by the API server
with a message that names the field and says what would be accepted, and the valid object the table starts from
is admitted (spec tables by a create, status tables through /status, where the writers of status send it)."""

from __future__ import annotations

from typing import Any

import cases_allocationclaim
import cases_gpunodegroup
import cases_gpuworkloadbudget
import cases_mignode
import cases_spotpool
import pytest
from admission_kit import Admission, variant

TABLES = {m.VALID["kind"]: m for m in (cases_gpuworkloadbudget, cases_gpunodegroup, cases_spotpool, cases_mignode,
                                       cases_allocationclaim)}
CASES = [(kind, *case) for kind, m in TABLES.items() for case in m.CASES]


@pytest.mark.parametrize("kind", TABLES)
def test_the_valid_object_is_admitted(admission: Admission, kind: str) -> None:
    valid = TABLES[kind].VALID
    code, out = admission.create(valid)
    assert code == 201, out
    if "status" in valid:
        code, out = admission.write(valid, status=True)
        assert code == 200, out


@pytest.mark.parametrize("kind", TABLES)
def test_each_table_has_at_least_fifteen_invalid_objects(kind: str) -> None:
    assert len(TABLES[kind].CASES) >= 15


@pytest.mark.parametrize(("kind", "path", "value", "field", "fix"), [c[:1] + c[2:] for c in CASES],
                         ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_refused_naming_the_field_and_the_fix(admission: Admission, kind: str, path: str, value: Any, field: str,
                                              fix: str) -> None:
    code, out = admission.write(variant(TABLES[kind].VALID, path, value), status=path.startswith("status."))
    assert code == 422 or (code == 400 and fix == "unknown field"), out
    message = out["message"]
    assert field in message and fix in message, message
