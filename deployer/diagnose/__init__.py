"""Diagnosis: engine log -> first traceback -> the known failure signature it matches; and effective-args drift.

Pure (a bounded read of a log file aside). May import remedy's data types, engines, profile and the leaves.
"""
