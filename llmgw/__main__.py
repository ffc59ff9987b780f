"""`python -m llmgw` is `llmgw`."""
from llmgw.cli.main import main

main()
