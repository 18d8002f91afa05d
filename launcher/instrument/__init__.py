"""Instruments loaded into the ranks of the user's own code."""
