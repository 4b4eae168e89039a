def add_tiny(x):
    return x + 1e-12
