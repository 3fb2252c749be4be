"""Rule tables, one module per domain, all registered in `registry`."""
from dflash_doctor.rules.registry import Rule, all_rules, lookup, register

__all__ = ["Rule", "all_rules", "lookup", "register"]
