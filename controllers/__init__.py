"""The reconcilers, one module per controller (see llmgw/runtime/controller.py
for the interface); llmgw/cmd/controller_manager.py registers them."""
