"""A module whose import holds a known number of bytes: twelve 4 MiB bytearrays made while it is
imported, kept for the life of the process."""

HELD = [bytearray(4 << 20) for _ in range(12)]
