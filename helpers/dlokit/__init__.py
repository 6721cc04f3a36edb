"""DLO-Kit: submit course jobs, watch them, and read what they report."""
__version__ = "0.1.0"
