"""What the node has: GPUs (nvidia-smi) and InfiniBand ports (sysfs)."""
