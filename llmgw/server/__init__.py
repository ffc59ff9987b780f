"""`llmgw server`: REST over etcd with mutual TLS (app: routes; authz: rules; tls: listener; cli: command)."""
