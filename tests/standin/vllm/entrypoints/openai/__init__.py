"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product."""
