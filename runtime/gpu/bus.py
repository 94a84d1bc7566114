"""PCI bus ids as the driver's tools print them, compared in one form."""

from __future__ import annotations


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:3B:00.0', '0000:3b:00.0' and the kernel log's '0000:3b:00' (function 0) name the
    same device: compare as 'domain:bus:dev.fn'."""
    parts = bus_id.strip().split(":")
    if len(parts) == 3:
        domain = int(parts[0], 16) if parts[0] else 0
        device = parts[2].lower() if "." in parts[2] else parts[2].lower() + ".0"
        return f"{domain:04x}:{parts[1].lower()}:{device}"
    return bus_id.strip().lower()
