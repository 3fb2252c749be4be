"""Rule tables, one module per domain, all registered in `registry`; `catalog` loads them for a lookup."""
from dflash_doctor.rules.catalog import all_rules, lookup
from dflash_doctor.rules.registry import Rule, register

__all__ = ["Rule", "all_rules", "lookup", "register"]
