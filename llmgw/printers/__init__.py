"""How llmgw's command-line tools show objects: one place for every table and output format.

`table` renders rows (plain text into a pipe, a rich table on a terminal, the
changed rows of a watch); `columns` says which columns each kind shows;
`objects` writes objects as yaml, json or names and describes one. The `llmgw`
verbs (llmgw/cli) and `llmgw-onboard-node` (llmgw/onboarding) both print
through it, so a node's row reads the same in both. It imports only the api.
"""
