"""Weights reaching a node before its engine starts: a Model's source resolved to a listing of
files (resolve.py), fetched with range resume and verified (fetch.py) into the agent's node-local,
content-addressed cache (cache.py), one pull per source at a time (puller.py). The agent owns it;
docs/contracts.md, "Weights", says what a pull promises."""
