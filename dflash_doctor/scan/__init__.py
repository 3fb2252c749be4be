"""Pure-AST static analysis for the hazards behind torch.compile thread races (rules DFD1xx-3xx).

Never imports torch and never imports or executes the scanned code.
"""
from dflash_doctor.scan.engine import scan_paths, scan_source, select_codes

__all__ = ["scan_paths", "scan_source", "select_codes"]
