"""Rendering: Profile + engine -> Bundle (launch script, env file, argv, content hash). Pure.

The launch script templates are package data in `render/templates/`, found by importlib.resources from a
plain checkout as well as from an installed wheel. May import engines, profile and the leaves.
"""
