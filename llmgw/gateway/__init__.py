"""The OpenAI-compatible gateway: routes requests by model name or alias to Ready replicas.

Modules: `table` (routing table fed by (type, obj) events), `balancer`
(least outstanding requests), `proxy` (the aiohttp app), `errors` (OpenAI
error bodies), `apikeys`, `metrics`, `source` (feeds the table from the
server's watch or a static file), `cli`.
"""
