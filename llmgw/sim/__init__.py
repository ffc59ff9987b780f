"""The simulated engine: a real multi-process "engine" that needs no GPU and no weights.

Rank 0 binds the dist-init port and waits for every worker; then it serves an
OpenAI-compatible API with fake tokens. Workers serve nothing. If any peer
drops, every rank exits non-zero. Run it as `llmgw sim ...` or `python -m llmgw.sim ...`.
"""
