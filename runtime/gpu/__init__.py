"""What the GPUs say: NVML and nvidia-smi probes, the recorded-output reader, and the per-node census on a Ray cluster."""
