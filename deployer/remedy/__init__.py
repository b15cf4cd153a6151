"""Remedies: a Diagnosis + the Profile + what the engine really used -> the Change to try next. Pure.

    effective.py  what the engine used in an attempt (its args dump, else the dry resolution, else the profile)
    propose.py    Change and `propose` (no identical change twice; renames carry the value; removals explicit)
"""
