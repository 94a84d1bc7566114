"""The durable state: the tables and their migrations, the one job lifecycle, the audit's row digests, and the store's identity and lease."""
