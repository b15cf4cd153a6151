"""deployer: deploy LLM inference servers (SGLang first) onto GPU boxes over SSH and keep them healthy."""

__version__ = "0.1.0"
