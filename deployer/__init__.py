"""deployer: deploy LLM inference servers (the engines of `deployer.engines`) onto GPU boxes over SSH and keep
them healthy."""

__version__ = "0.1.0"
