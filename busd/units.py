"""Units of size, for the limits busd declares in bytes."""

KIB = 1024
MIB = 1024 * KIB
