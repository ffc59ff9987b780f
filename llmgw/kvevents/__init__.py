"""KV-cache events as vLLM publishes them: the wire format, the sim's publisher, the gateway's subscriber.

docs/contracts.md, "KV events", has the layout and the vLLM commit it follows.
"""
