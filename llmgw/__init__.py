"""llmgw: run LLM inference engines across a fleet of GPU machines (its version: llmgw.version)."""
