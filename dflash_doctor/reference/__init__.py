"""The bundled reference DFlash pipeline: a frozen target, a DFlash drafter, and the workers that train it.

Importing the package imports nothing heavy; the modules that need torch import it themselves.
"""
