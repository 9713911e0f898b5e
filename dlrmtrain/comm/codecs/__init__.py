"""One module per codec; registry.py maps their names to instances."""
