"""Check compiled objects against their description: PTX parameters and pointer roles, element
types, architecture features."""
