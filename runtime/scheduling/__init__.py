"""Who runs when and where: placement, the snapshot it reads, tariffs and local time, retry backoff, and sweeps."""
