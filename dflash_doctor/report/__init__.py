"""The shareable bug-report bundle: gather (bundle.py), redact (redact.py), lay out and write (document.py)."""
from dflash_doctor.report.bundle import Bundle, BundleSources, build_bundle
from dflash_doctor.report.document import render_html, render_markdown
from dflash_doctor.report.last_repro import last_repro_path, remember_repro, save_last_repro

__all__ = [
    "Bundle", "BundleSources", "build_bundle", "render_html", "render_markdown", "last_repro_path", "remember_repro",
    "save_last_repro",
]
