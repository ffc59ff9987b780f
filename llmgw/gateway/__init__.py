"""The OpenAI-compatible gateway: routes requests by model name or alias to Ready replicas.

Modules: `table` (routing table fed by (type, obj) events), `balancer`
(least outstanding requests), `proxy` (the routes and the proxying),
`server` (the client-facing HTTP/1.1 server), `upstream` (keep-alive
connections to the engines), `response` and `errors` (responses, OpenAI's
error bodies), `apikeys`, `metrics`, `source` (feeds the table from the
server's watch or a static file), `cli`.
"""
