"""The OpenAI-compatible gateway: routes requests by model name or alias to Ready replicas.

Modules: `gateway` (the routes; each proxied request through the chain of steps), `chain`,
`step` and `steps/` (the steps in order, the step and the call it works on, one module per
step), `proxy` (forwarding to a replica: retries, streaming), `http1` (the client-facing
HTTP/1.1 server), `upstream` (keep-alive connections to the engines), `table` (routing
table fed by (type, obj) events), `balancer` (requests in flight, each model's policy),
`auth` (the Authenticator protocol: `apikeys`, a key file; `keyring`, the watched ApiKeys),
`response` and `errors` (responses, OpenAI's error bodies), `metrics`, `source` (feeds the
table from the server's watch or a static file); docs/architecture.md lists them all.
"""
