"""The per-release table of shared/FACTS.md section 1, shown beside what was read: corroboration, never the answer.

A disagreement is worth seeing (a patched build, a backport, a nightly), so it is reported, but the verdict always
comes from the source that was read.
"""
from __future__ import annotations

import re
from typing import Optional

from dflash_doctor.guards.layout import MODULE_GLOBAL, THREAD_LOCAL

# (releases, predicate in compile_wrapper, FX flag storage, masked during a Dynamo compile), read from each wheel.
RELEASE_TABLE = (
    (("2.6", "2.8"), "is_fx_tracing", MODULE_GLOBAL, False),
    (("2.9", "2.10", "2.11", "2.12"), "is_fx_symbolic_tracing", MODULE_GLOBAL, False),
    (("2.13",), "is_fx_symbolic_tracing", MODULE_GLOBAL, True),
    (("2.14",), "is_fx_symbolic_tracing", THREAD_LOCAL, True),
)


def release_of(version: Optional[str]) -> Optional[str]:
    match = re.match(r"^(\d+)\.(\d+)", version or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def corroborate(version: Optional[str], predicate: Optional[str], storage: str, masked: bool) -> dict:
    release = release_of(version)
    for releases, table_predicate, table_storage, table_masked in RELEASE_TABLE:
        if release in releases:
            expected = {"predicate": table_predicate, "fx_flag_storage": table_storage,
                        "masked_during_compile": table_masked}
            found = {"predicate": predicate, "fx_flag_storage": storage, "masked_during_compile": masked}
            differences = [key for key in expected if expected[key] != found[key]]
            return {"release": release, "table_row": expected, "agrees": not differences,
                    "differences": differences}
    return {"release": release, "table_row": None, "agrees": None, "differences": []}
