"""`python -m llmgw.sim ARGS` is `llmgw sim ARGS`."""
from llmgw.sim.cli import main

if __name__ == "__main__":
    main()
