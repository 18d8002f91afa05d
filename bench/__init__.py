"""Benchmarks (BENCHMARKS.md), each a module run from the checkout root.

    python -m bench.throughput --help
"""
