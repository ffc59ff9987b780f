"""`python -m llmgw` is `llmgw`."""
from llmgw.cli.main import cli

cli()
