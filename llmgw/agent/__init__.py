"""The node agent: discovers the node, registers it, runs and supervises its shards' engines."""
