"""The steps of the gateway's request chain, one module each; chain.py puts them in order."""
