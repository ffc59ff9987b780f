"""Local clusters for development and tests: `llmgw dev up`."""
