"""The API server's handlers, a module by resource; llmgw/server/app.py routes to them."""
