"""llmgw: run LLM inference engines across a fleet of GPU machines."""
__version__ = "0.1.0"
