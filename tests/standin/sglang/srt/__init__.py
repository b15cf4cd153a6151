"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product."""
