"""How llmgw's command-line tools show objects: one place for every table and output format.

`table` renders rows (plain text into a pipe, a rich table on a terminal, the
changed rows of a watch); `kinds` holds each kind's printer (its columns, `-o
wide`'s, what `describe` shows beside an object), registered by kind class;
`objects` writes objects as yaml, json or names, `describe` one object's text. The
`llmgw` verbs (llmgw/cli) and `llmgw-onboard-node` (llmgw/onboarding) both print
through it, so a node's row reads the same in both. It imports only the api.
"""
