"""`python -m llmgw.sim ARGS` is `llmgw sim ARGS`."""
from llmgw.cmd.sim import main

if __name__ == "__main__":
    main()
