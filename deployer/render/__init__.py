"""Rendering: Profile + engine -> Bundle (launch script, env file, argv, content hash). Pure.

The launch script templates are the engines' own (`Launch.template`, package data of each engine's package,
shipped in the wheel). May import engines, profile and the leaves.
"""
