"""Validate SARIF against the vendored official OASIS 2.1.0 schema, plus what GitHub code scanning adds on top."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import dflash_doctor

SCHEMA_PATH = Path(dflash_doctor.__file__).parent / "data" / "sarif-schema-2.1.0.json"


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def assert_valid_sarif(document: dict) -> None:
    """Schema-valid, and shaped as GitHub's upload requires: a location per result, known rule ids, no
    absolute URIs inside the repository, fingerprints that are unique within the run."""
    errors = sorted(_validator().iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])
    for run in document["runs"]:
        rule_ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
        fingerprints = []
        for result in run["results"]:
            assert result["ruleId"] in rule_ids, result["ruleId"]
            assert rule_ids[result["ruleIndex"]] == result["ruleId"]
            assert result["locations"], f"result without a location: {result}"
            for location in result["locations"]:
                artifact = location["physicalLocation"]["artifactLocation"]
                assert not artifact["uri"].startswith("/"), artifact
                assert location["physicalLocation"]["region"]["startLine"] >= 1
            fingerprints.append(result["partialFingerprints"]["dflashDoctor/v1"])
        assert len(fingerprints) == len(set(fingerprints)), "duplicate partialFingerprints"
