"""Diagnosis: engine log -> first traceback -> the known failure signature it matches; effective-args drift.

Pure (a bounded read of a log file aside). A step above `remedy` (a Diagnosis shows its remedy's preview):
may import remedy, engines, profile and the leaves.
"""
